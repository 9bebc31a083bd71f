"""`rollcap run --teleop keyboard` under a real X server (Xvfb), driven by real key presses (xdotool).

One Xvfb for the module; skipped with the reason when Xvfb, xdotool or pynput is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from rollcap.rollout.recording import load_any

if importlib.util.find_spec("pynput") is None:  # importing pynput itself needs a display: only look for it
    pytest.skip("pynput is not installed (pip install 'rollcap[teleop]')", allow_module_level=True)
from rollcap.rollout.bench import teleop as bench  # noqa: E402


@pytest.fixture(scope="module")
def display():
    try:
        with bench.xvfb() as name:
            yield name
    except bench.XUnavailable as err:
        pytest.skip(str(err))


class Lines:
    """Collects a subprocess's stderr lines on a thread; waits for one that contains a text."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream):
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, text: str, after: int = 0, timeout: float = 60.0) -> int:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(text in ln for ln in self.lines[after:]), timeout)
            assert ok, f"no {text!r} in stderr after line {after}: {self.lines[-10:]}"
            return next(i for i in range(after, len(self.lines)) if text in self.lines[i]) + 1


_LONG = ["--env-kwargs", '{"image_size": 32, "max_steps": 100000}']  # episodes last until a key ends them


@contextlib.contextmanager
def _rollcap_run(display: str, ckpt, out, *args: str) -> Iterator[tuple[subprocess.Popen, Lines]]:
    """``rollcap run --teleop keyboard`` on ``display`` with the tiny models, and its stderr's :class:`Lines`.

    Leaving waits for the run to exit (two minutes at most); an exception kills it at once.
    """
    env = {**os.environ, "DISPLAY": display}
    cmd = [
        sys.executable,
        "-m",
        "rollcap.rollout.cli",
        "run",
        "--out",
        str(out),
        "--teleop",
        "keyboard",
        "--no-progress",
        *ckpt[:4],
        *_LONG,
        *args,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc, Lines(proc.stderr)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_real_keys_label_end_discard_and_quit_a_recorded_run(display, ckpt, tmp_path):
    """y then e: episode 0 ends by keyboard, labelled a success; g, then r: episode 1 is discarded; g, q, e: it is
    re-recorded under index 1 and the run ends cleanly; both files hold exactly episodes 0 and 1."""
    out = tmp_path / "r"
    with _rollcap_run(display, ckpt, out, "--episodes", "5") as (proc, err):
        at = err.wait_for("teleop: running")
        time.sleep(0.3)
        bench.xdotool(display, "key", "y")
        bench.xdotool(display, "key", "e")
        at = err.wait_for("awaiting reset", at)
        bench.xdotool(display, "key", "g")
        at = err.wait_for("teleop: running", at)
        bench.xdotool(display, "key", "r")
        at = err.wait_for("awaiting reset", at)
        bench.xdotool(display, "key", "g")
        at = err.wait_for("teleop: running", at)
        bench.xdotool(display, "key", "q")
        bench.xdotool(display, "key", "e")  # quit lets the running episode finish: end it now
    stdout = proc.stdout.read()
    assert proc.returncode == 0, (stdout, err.lines[-20:])
    npz, h5 = load_any(out / "episodes"), load_any(out / "episodes.hdf5")
    assert [r.index for r in npz] == [r.index for r in h5] == [0, 1]
    assert npz[0].stop_reason == "keyboard" and npz[0].success
    assert not [ln for ln in err.lines if "Traceback" in ln]


@pytest.mark.slow
def test_a_go_key_pressed_while_an_episode_runs_does_not_skip_the_next_reset(display, ckpt, tmp_path):
    """g while episode 0 runs, then e: the run awaits reset until g is pressed again (the early g is not kept)."""
    out = tmp_path / "r"
    with _rollcap_run(display, ckpt, out, "--episodes", "2", "--control-period-s", "0.1") as (proc, err):
        at = err.wait_for("teleop: running")
        time.sleep(0.5)
        bench.xdotool(display, "key", "g")
        time.sleep(0.5)
        bench.xdotool(display, "key", "e")  # X delivers keys in order: g reached the run before e ended the episode
        at = err.wait_for("awaiting reset", at)
        time.sleep(1.5)
        assert not [ln for ln in err.lines[at:] if "teleop: running" in ln], err.lines  # no key pressed: still waiting
        bench.xdotool(display, "key", "g")
        at = err.wait_for("teleop: running", at)
        bench.xdotool(display, "key", "e")
        at = err.wait_for("awaiting reset", at)
        bench.xdotool(display, "key", "g")
    stdout = proc.stdout.read()
    assert proc.returncode == 0, (stdout, err.lines[-20:])
    assert [r.stop_reason for r in load_any(out / "episodes")] == ["keyboard", "keyboard"]


@pytest.mark.slow(seconds=42)
def test_no_x_error_when_a_run_ends_right_after_a_key(display, ckpt, tmp_path):
    """Six runs, each ending right after a key (the go key at the last reset): none prints an X protocol error."""
    errors = {}
    for k in range(6):
        with _rollcap_run(display, ckpt, tmp_path / f"r{k}", "--episodes", "1") as (proc, err):
            at = err.wait_for("teleop: running")
            bench.xdotool(display, "key", "e")
            err.wait_for("awaiting reset", at)
            bench.xdotool(display, "key", "g")  # the run ends on its key-down; the key-up is still on its way
        assert proc.returncode == 0, (proc.stdout.read(), err.lines[-20:])
        if any("X protocol error" in ln or "XError" in ln for ln in err.lines):
            errors[k] = err.lines[-3:]
    assert not errors, f"{len(errors)} of 6 runs printed an X error: {errors}"


@pytest.mark.slow
def test_a_discard_by_key_is_named_in_the_summary(display, ckpt, tmp_path):
    """r, then g: the episode is re-recorded; summary.json counts it as discarded by key (apart from episodes
    left unwritten at an interrupt), and the printed summary names it."""
    out = tmp_path / "r"
    with _rollcap_run(display, ckpt, out, "--episodes", "1") as (proc, err):
        at = err.wait_for("teleop: running")
        bench.xdotool(display, "key", "r")
        at = err.wait_for("awaiting reset", at)
        bench.xdotool(display, "key", "g")
        at = err.wait_for("teleop: running", at)
        bench.xdotool(display, "key", "e")
        at = err.wait_for("awaiting reset", at)
        bench.xdotool(display, "key", "g")
    stdout = proc.stdout.read()
    assert proc.returncode == 0, (stdout, err.lines[-20:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["discarded_by_key"] == [0] and summary["unwritten_at_interrupt"] == []
    assert "discarded by key  1 (episode 0; not recorded)" in stdout, stdout
