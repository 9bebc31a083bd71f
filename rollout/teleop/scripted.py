"""Scripted keys: ``WHEN KEY [down|up]`` lines played into an episode, for tests and reproducible demos."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from rollcap.rollout.protocols import EpisodeStart, StepEvent, Subscriber
from rollcap.rollout.teleop.keys import key_name
from rollcap.rollout.teleop.keysource import KeySource, SourceUnavailable


@dataclass(frozen=True)
class ScriptLine:
    """One scripted key event."""

    delay_s: float | None
    """Seconds after the previous line fired (None: a step trigger)."""
    step: int | None
    """Fire when the running episode has done this many env steps (on the host thread)."""
    key: str
    action: str
    """``tap``, ``down`` or ``up``."""


def parse_script(lines: Sequence[str], where: str = "script") -> list[ScriptLine]:
    """Parse ``WHEN KEY [down|up]`` lines (``#`` starts a comment).

    ``WHEN`` is seconds after the previous line fired (``0.5``), or
    ``step=N``: when the running episode has done ``N`` env steps (fired on
    the host's thread, before anything else happens: deterministic). A
    ``0`` line right after a step line fires with it, in the same hook. A
    timed go key (``0.05 g``) also waits until the host awaits reset, as a
    person does (the bus ignores a go key pressed while an episode runs).
    """
    out = []
    for n, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].split()
        if not text:
            continue
        try:
            if len(text) not in (2, 3) or (len(text) == 3 and text[2] not in ("down", "up")):
                raise ValueError("expected WHEN KEY [down|up]")
            when, key = text[0], key_name(text[1])
            if when.startswith("step="):
                step, delay = int(when[5:]), None
                if step < 0:
                    raise ValueError(f"step must be >= 0, got {step}")
            else:
                step, delay = None, float(when)
                if not delay >= 0:
                    raise ValueError(f"seconds must be >= 0, got {when}")
        except ValueError as err:
            raise ValueError(f"{where} line {n}: {raw.strip()!r}: {err}") from err
        out.append(ScriptLine(delay, step, key, text[2] if len(text) == 3 else "tap"))
    return out


class ScriptedSource(KeySource, Subscriber):
    """Keys from a script: a file of ``WHEN KEY [down|up]`` lines, or a list of such lines.

    Timed lines fire on the source's thread (a go key once the host also awaits
    reset); ``step=N`` lines fire inside the host's hooks, so add the source to
    the host's subscribers when the script uses them. Lines fire in order, each once.
    """

    name = "scripted"

    def __init__(self, script: str | Path | Sequence[str], *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(script, (str, Path)):
            path = Path(script)
            try:
                text = path.read_text().splitlines()
            except OSError as err:
                raise SourceUnavailable(f"cannot read the key script {str(path)!r}: {err.strerror}") from err
            self.lines = parse_script(text, str(path))
        else:
            self.lines = parse_script(list(script))
        self._cond = threading.Condition()
        self._next = 0
        self._last_fire = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def finished(self) -> bool:
        """Every line has fired."""
        return self._next >= len(self.lines)

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until every line has fired; True if it did."""
        with self._cond:
            return self._cond.wait_for(lambda: self.finished or self._stopping, timeout) and self.finished

    def _start(self) -> None:
        self._last_fire = time.perf_counter()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="rollcap-teleop-script", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(2.0)

    def _fire(self) -> None:  # under the condition's lock
        line = self.lines[self._next]
        self._next += 1
        self._last_fire = time.perf_counter()
        {"tap": self.controller.tap, "down": self.controller.press, "up": self.controller.release}[line.action](
            line.key
        )
        self._cond.notify_all()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopping and not self.finished:
                line = self.lines[self._next]
                if line.delay_s is None:  # a step line: the host's hooks fire it
                    self._cond.wait()
                    continue
                due = self._last_fire + line.delay_s
                now = time.perf_counter()
                if now < due:
                    self._cond.wait(due - now)
                    continue
                if self._early_go(line):
                    self._cond.wait(0.01)  # the bus has no wake-up for this: look again shortly
                    continue
                self._fire()

    def _early_go(self, line: ScriptLine) -> bool:
        """A go key the bus would ignore now: the host does not await reset yet."""
        return line.action != "up" and self.keys.verb_of(line.key) == "go" and not self.controller.bus.awaiting_go

    def _at_step(self, done: int) -> None:
        if not self.started:
            return
        with self._cond:
            fired = False
            while not self.finished:
                line = self.lines[self._next]
                if line.step == done or (fired and line.delay_s == 0):
                    self._fire()
                    fired = True
                else:
                    break

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._at_step(0)

    def on_step(self, step: StepEvent) -> None:
        self._at_step(step.step + 1)
