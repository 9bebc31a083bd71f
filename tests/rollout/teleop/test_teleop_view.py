"""The live view: off (saying so once) without a display; under Xvfb a window showing the scene, the plan and the value."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from rollcap.rollout.config import HostConfig
from rollcap.rollout.events import EventBus
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.teleop.status import TeleopStatus
from rollcap.rollout.teleop.view import LiveView, ViewConfig
from tests.rollout._tiny import make_env


@pytest.fixture(scope="module")
def display():
    """An Xvfb server for this module (skipped without xvfb or tkinter)."""
    from rollcap.rollout.bench.teleop import XUnavailable, xvfb

    pytest.importorskip("tkinter", reason="tkinter is missing (Debian: apt-get install python3-tk)")
    try:
        with xvfb("1024x768x24") as name:
            yield name
    except XUnavailable as err:
        pytest.skip(str(err))


def test_without_a_display_the_view_is_off_and_says_so_once(monkeypatch):
    """No DISPLAY: start() is False, one line says why, and the hooks still cost nothing."""
    monkeypatch.delenv("DISPLAY", raising=False)
    out = io.StringIO()
    view = LiveView(stream=out)
    assert not view.start() and not view.start()
    assert out.getvalue() == "teleop view: off (no X display ($DISPLAY unset))\n"
    view.stop()


def test_view_config_is_validated():
    """Sizes and rates out of range are refused, naming the field."""
    with pytest.raises(ValueError, match="image_px"):
        ViewConfig(image_px=8)
    with pytest.raises(ValueError, match="fps"):
        ViewConfig(fps=0)


def _screenshot(display):
    image_grab = pytest.importorskip("PIL.ImageGrab", reason="Pillow is needed for the screenshot")
    from PIL import features

    if not features.check("xcb"):
        pytest.skip("this Pillow has no XCB support for screenshots")
    return np.asarray(image_grab.grab(xdisplay=display).convert("RGB"))


def _has(shot, rgb, tol=6):
    return int((np.abs(shot.astype(int) - np.array(rgb)).max(axis=-1) <= tol).sum())


def test_the_window_shows_scene_plan_and_value_under_xvfb(display, runners, monkeypatch):
    """A real episode drives the view; a screenshot shows the table, the planned path and the value bar."""
    monkeypatch.setenv("DISPLAY", display)
    bus = EventBus()
    status = TeleopStatus(bus)
    view = LiveView(ViewConfig(fps=30), status=status)
    assert view.start(), view.reason
    try:
        host = RolloutHost(make_env(), *runners, HostConfig(seed=5, max_chunks=3), [status, view], events=bus)
        end = host.run_episode(0)
        deadline = time.monotonic() + 5
        drawn = view.frames
        while time.monotonic() < deadline and view.frames == drawn:
            time.sleep(0.05)
        time.sleep(0.3)  # let the window map and paint
        shot = _screenshot(display)
    finally:
        view.stop()
    assert (
        view.frames >= 1 and view.frames <= end.num_steps + end.num_chunks + 2
    )  # newest only: frames are dropped, never queued
    assert (shot.reshape(-1, 3).max(axis=1) > 0).mean() > 0.05, "the screen is blank"
    table = tuple(int(round(c * 255)) for c in (0.78, 0.72, 0.62))
    assert _has(shot, table) > 5000, "no scene image"
    assert _has(shot, (0xFF, 0xD4, 0x00)) > 50, "no planned path"
    assert _has(shot, (0x66, 0xBB, 0x6A)) > 50, "no value bar"


def test_hooks_do_not_wait_for_the_window(display, runners, monkeypatch):
    """While the window draws, a hook costs microseconds (reference swaps), not a frame."""
    monkeypatch.setenv("DISPLAY", display)
    view = LiveView(ViewConfig(fps=60))
    assert view.start(), view.reason
    steps = []

    class Keep:
        wants_records = False

        def __getattr__(self, name):
            return lambda *a: None

        def on_step(self, step):
            steps.append(step)

    try:
        host = RolloutHost(make_env(), *runners, HostConfig(seed=1, max_chunks=2), [Keep(), view])
        host.run_episode(0)
        times = []
        for _ in range(200):
            for step in steps:
                t = time.perf_counter()
                view.on_step(step)
                times.append(time.perf_counter() - t)
    finally:
        view.stop()
    assert np.median(times) < 20e-6, np.median(times)
