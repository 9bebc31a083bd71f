"""A live view for the person at the keys: the scene, the planned chunk, the critic value.

:class:`LiveView` is a :class:`Subscriber` whose hooks only keep references
to the newest event data; a Tk window on its own thread draws the newest of it
at up to ``fps`` frames a second (what came in between is dropped), so the
host never waits on the window. Without an X display, or without tkinter, the
view is off and says so once.

The window shows the observation image (scaled up), the planned chunk as a
path over the image where the env has a :data:`PLAN_PATHS` entry (PushBlock:
the pusher's path under the planned velocities), the chunk's action
components over its horizon with the step now executing, the critic value with
its history, and the teleop status line.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rollcap.rollout.episode import ACTOR_HUMAN
from rollcap.rollout.protocols import ChunkEvent, EpisodeStart, Observation, StepEvent, Subscriber


def pushblock_path(start: EpisodeStart, obs: Observation, actions: np.ndarray) -> np.ndarray | None:
    """PushBlock: where the pusher goes under the planned velocities, in image coordinates ``[N+1, 2]`` (x, y in [0, 1]).

    From the pusher position in ``obs["state"][:2]`` (metres), each action
    moving it ``action * max_speed * frame_skip * 0.01 s`` (the env's control
    period); image x is world x, image y is minus world y (the camera is top-down).
    """
    from rollcap.envs.push_block import PushBlockConfig

    state = obs.get("state") if hasattr(obs, "get") else None
    if state is None or actions.ndim != 2 or actions.shape[1] != 2:
        return None
    default = PushBlockConfig()
    kw = start.env_kwargs
    scene = kw.get("scene")
    half = scene.get("table_half", default.scene.table_half) if isinstance(scene, dict) else default.scene.table_half
    step = float(kw.get("max_speed", default.max_speed)) * int(kw.get("frame_skip", default.frame_skip)) * 0.01
    xy = np.asarray(state[:2], np.float64) + np.concatenate(
        [np.zeros((1, 2)), np.cumsum(np.clip(actions, -1, 1) * step, axis=0)]
    )
    return np.stack([(xy[:, 0] + half) / (2 * half), (half - xy[:, 1]) / (2 * half)], axis=1)


PLAN_PATHS: dict[str, Callable[[EpisodeStart, Observation, np.ndarray], np.ndarray | None]] = {
    "rollcap/PushBlock-v0": pushblock_path,
}
"""env id -> the planned chunk as a path over the image (add an entry for your env)."""


@dataclass(frozen=True)
class ViewConfig:
    """Options of :class:`LiveView`."""

    image_px: int = 320
    """Side of the drawn scene image in pixels (the observation is scaled up by a whole factor)."""
    fps: float = 20.0
    """Most frames drawn per second (newer events replace unseen ones)."""
    image_key: str | None = None
    """The observation key of the image to show; None: the first ``image_*`` key."""
    title: str = "rollcap teleop"
    """The window title."""

    def __post_init__(self) -> None:
        if not isinstance(self.image_px, int) or not 32 <= self.image_px <= 2048:
            raise ValueError(f"ViewConfig.image_px: expected an int in 32..2048, got {self.image_px!r}")
        if not 0 < self.fps <= 120:
            raise ValueError(f"ViewConfig.fps: expected frames per second in (0, 120], got {self.fps!r}")


@dataclass
class _Latest:
    start: EpisodeStart | None = None
    obs: Observation | None = None
    chunk: ChunkEvent | None = None
    step: int = 0
    human: bool = False
    version: int = 0


_W, _PANEL = 260, 12  # right panel width, margin


class LiveView(Subscriber):
    """The scene, the planned chunk and the critic value in a window drawn on its own thread.

    Call :meth:`start` (opens the window; False and one printed line when the
    view is off) and :meth:`stop`. Hooks run on the host thread and only swap
    references: the window's thread reads the newest at its own pace.

    Args:
        config: size, rate, which image.
        status: a :class:`~rollcap.rollout.teleop.status.TeleopStatus` whose line is shown.
        stream: where the one "view off" line goes (default stderr).
    """

    def __init__(self, config: ViewConfig | None = None, status=None, stream=None):
        self.config = config or ViewConfig()
        self.status, self.stream = status, stream
        self.reason: str | None = None
        """Why the view is off (None while on or not started)."""
        self.frames = 0
        """Frames drawn so far."""
        self._latest = _Latest()
        self._values: tuple[float, ...] = ()  # replaced, never mutated: the window's thread reads it
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False

    @property
    def on(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.reason is None

    # -- lifecycle (the driver's thread) ----------------------------------------
    def start(self, timeout_s: float = 10.0) -> bool:
        """Open the window; False (after printing why, once) when the view cannot be shown here."""
        if not os.environ.get("DISPLAY"):
            return self._off("no X display ($DISPLAY unset)")
        try:
            import tkinter  # noqa: F401
        except ImportError:
            return self._off("tkinter is missing (Debian: apt-get install python3-tk)")
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="rollcap-teleop-view", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            return self._off(f"the window did not open within {timeout_s:g} s")
        return self.reason is None

    def stop(self) -> None:
        """Close the window and join its thread (idempotent)."""
        self._stopping = True
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _off(self, why: str) -> bool:
        if self.reason is None:
            self.reason = why
            print(f"teleop view: off ({why})", file=self.stream or sys.stderr, flush=True)
        return False

    # -- hooks (the host's thread: reference swaps only) -----------------------------
    def on_episode_start(self, start: EpisodeStart) -> None:
        self._latest = _Latest(start, start.obs, None, 0, False, self._latest.version + 1)
        self._values = ()

    def on_chunk(self, chunk: ChunkEvent) -> None:
        latest = self._latest
        latest.chunk, latest.obs = chunk, chunk.obs
        self._values = (*self._values[-119:], chunk.value)
        latest.version += 1

    def on_step(self, step: StepEvent) -> None:
        latest = self._latest
        latest.obs, latest.step, latest.human = step.next_obs, step.step + 1, step.actor == ACTOR_HUMAN
        latest.version += 1

    # -- the window's thread ------------------------------------------------------
    def _run(self) -> None:
        try:
            self._window()
        except Exception as err:  # noqa: BLE001 - never take the rollout down with the window
            self._off(f"the window failed: {type(err).__name__}: {err}")
        finally:
            gc.collect()  # Tk objects must die on the thread that made them (Tcl aborts the process otherwise)
            self._ready.set()

    def _window(self) -> None:
        try:
            import tkinter as tk

            root = tk.Tk()
        except Exception as err:  # noqa: BLE001 - a display that refuses us: the view is off
            self._off(f"no window: {type(err).__name__}: {err}")
            return
        canvas = _Canvas(tk, root, self.config)
        root.protocol("WM_DELETE_WINDOW", lambda: setattr(self, "_stopping", True))
        self._ready.set()
        period_ms = max(1, int(1000 / self.config.fps))
        seen = -1

        def tick():
            nonlocal seen
            if self._stopping:
                root.destroy()
                return
            latest = self._latest
            if latest.version != seen:
                seen = latest.version
                try:
                    canvas.draw(latest, self._values, self.status.line() if self.status is not None else "")
                except Exception as err:  # noqa: BLE001 - an observation the view cannot draw: off, the rollout goes on
                    self._off(f"cannot draw: {type(err).__name__}: {err}")
                    root.destroy()
                    return
                self.frames += 1
            root.after(period_ms, tick)

        root.after(0, tick)
        root.mainloop()


class _Canvas:
    """The window's items, created once and updated in place (the window's thread only)."""

    def __init__(self, tk, root, config: ViewConfig):
        self.tk, self.config = tk, config
        root.title(config.title)
        px = config.image_px
        self.c = c = tk.Canvas(
            root, width=px + _W + 3 * _PANEL, height=px + 2 * _PANEL + 64, bg="#1e1e1e", highlightthickness=0
        )
        c.pack()
        self.photo = tk.PhotoImage(width=px, height=px)
        c.create_image(_PANEL, _PANEL, image=self.photo, anchor="nw")
        self.path = c.create_line(0, 0, 0, 0, fill="#ffd400", width=3, arrow="last", state="hidden")
        x0 = px + 2 * _PANEL
        self.x0 = x0
        c.create_text(
            x0,
            _PANEL,
            text="planned chunk (a0 blue, a1 orange)",
            fill="#cccccc",
            anchor="nw",
            font=("TkDefaultFont", 9),
        )
        self.plot = (x0, _PANEL + 18, _W, 120)  # action components over the horizon
        c.create_rectangle(x0, self.plot[1], x0 + _W, self.plot[1] + self.plot[3], outline="#555555")
        c.create_line(x0, self.plot[1] + self.plot[3] / 2, x0 + _W, self.plot[1] + self.plot[3] / 2, fill="#444444")
        self.lines = [
            c.create_line(0, 0, 0, 0, fill=col, width=2) for col in ("#4fc3f7", "#ff8a65", "#aed581", "#ba68c8")
        ]
        self.cursor = c.create_line(0, 0, 0, 0, fill="#ffffff", dash=(2, 2))
        vy = self.plot[1] + self.plot[3] + 24
        self.value_text = c.create_text(x0, vy, text="value", fill="#cccccc", anchor="nw", font=("TkDefaultFont", 9))
        self.vbar = (x0, vy + 18, _W, 14)
        c.create_rectangle(x0, self.vbar[1], x0 + _W, self.vbar[1] + self.vbar[3], outline="#555555")
        self.bar = c.create_rectangle(x0, self.vbar[1], x0, self.vbar[1] + self.vbar[3], fill="#66bb6a", width=0)
        self.spark = (x0, self.vbar[1] + 24, _W, 60)
        c.create_rectangle(x0, self.spark[1], x0 + _W, self.spark[1] + self.spark[3], outline="#555555")
        self.history = c.create_line(0, 0, 0, 0, fill="#66bb6a", width=2, state="hidden")
        self.actor = c.create_text(
            x0,
            self.spark[1] + self.spark[3] + 8,
            text="",
            fill="#ffd400",
            anchor="nw",
            font=("TkDefaultFont", 11, "bold"),
        )
        self.status = c.create_text(
            _PANEL,
            px + 2 * _PANEL,
            text="",
            fill="#dddddd",
            anchor="nw",
            width=px + _W + _PANEL,
            font=("TkDefaultFont", 9),
        )
        self.image_key: str | None = config.image_key

    def draw(self, latest: _Latest, values: tuple[float, ...], status: str) -> None:
        c, px = self.c, self.config.image_px
        obs = latest.obs
        image = self._image(obs)
        if image is not None:
            h, w = image.shape[:2]
            k = max(1, px // max(h, w))
            big = np.repeat(np.repeat(image, k, axis=0), k, axis=1)[:px, :px]
            header = f"P6 {big.shape[1]} {big.shape[0]} 255\n".encode()
            self.photo.configure(data=header + np.ascontiguousarray(big).tobytes(), format="PPM")
        chunk = latest.chunk
        if chunk is not None:
            actions = np.asarray(chunk.actions, np.float64)
            path = None
            if latest.start is not None and (plan := PLAN_PATHS.get(latest.start.env_id)) is not None:
                path = plan(latest.start, chunk.obs, actions)
            if path is not None and np.isfinite(path).all():
                pts = (np.clip(path, 0, 1) * px + _PANEL).ravel().tolist()
                c.coords(self.path, *pts)
                c.itemconfigure(self.path, state="normal")
            else:
                c.itemconfigure(self.path, state="hidden")
            x0, y0, w, h = self.plot
            n = actions.shape[0]
            xs = x0 + (np.arange(n) + 0.5) * w / n
            for i, item in enumerate(self.lines):
                if i < actions.shape[1] and n > 1:
                    ys = y0 + h / 2 - np.clip(actions[:, i], -1, 1) * (h / 2 - 2)
                    c.coords(item, *np.stack([xs, ys], 1).ravel().tolist())
                    c.itemconfigure(item, state="normal")
                else:
                    c.itemconfigure(item, state="hidden")
            at = min(max(latest.step - chunk.step, 0), n - 1)
            c.coords(self.cursor, xs[at], y0, xs[at], y0 + h)
            value = chunk.value
            c.itemconfigure(
                self.value_text, text=f"value {value:+.3f}" if math.isfinite(value) else "value (no critic)"
            )
            x0, y0, w, h = self.vbar
            frac = min(max(value + 1.0, 0.0), 1.0) if math.isfinite(value) else 0.0  # values lie in [-1, 0]
            c.coords(self.bar, x0, y0, x0 + frac * w, y0 + h)
        finite = [v for v in values if math.isfinite(v)]
        if len(finite) > 1:
            x0, y0, w, h = self.spark
            xs = x0 + np.linspace(0, w, len(finite))
            ys = y0 + h - (np.clip(np.asarray(finite) + 1.0, 0, 1)) * h
            c.coords(self.history, *np.stack([xs, ys], 1).ravel().tolist())
            c.itemconfigure(self.history, state="normal")
        else:
            c.itemconfigure(self.history, state="hidden")
        c.itemconfigure(self.actor, text="HUMAN DRIVING" if latest.human else "")
        instruction = latest.start.instruction if latest.start is not None else ""
        c.itemconfigure(self.status, text=f"{instruction}\n{status}" if instruction else status)

    def _image(self, obs) -> np.ndarray | None:
        if not hasattr(obs, "get"):
            return None
        if self.image_key is None:
            self.image_key = next((k for k in obs if str(k).startswith("image_")), None)
        image = obs.get(self.image_key) if self.image_key is not None else None
        if image is None:
            return None
        image = np.asarray(image)
        if image.ndim == 3 and image.shape[0] in (1, 3) and image.shape[-1] not in (1, 3):
            image = image.transpose(1, 2, 0)  # CHW -> HWC
        if image.ndim == 2:
            image = image[..., None]
        if image.shape[-1] == 1:
            image = np.repeat(image, 3, axis=-1)
        if image.dtype != np.uint8:
            image = (np.clip(image, 0, 1) * 255).astype(np.uint8) if image.dtype.kind == "f" else image.astype(np.uint8)
        return image[..., :3]
