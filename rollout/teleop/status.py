"""The live teleop state, for a progress display and the view."""

from __future__ import annotations

import threading

from rollcap.rollout.episode import ACTOR_HUMAN
from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import EpisodeEnd, EpisodeStart, StepEvent, Subscriber
from rollcap.rollout.teleop.keys import KeyController, TeleopKeys


class TeleopStatus(Subscriber):
    """What the person at the keys needs to know: the state, the episode, the keys.

    States: ``waiting`` (before the first episode), ``running``, ``paused``,
    ``intervening`` (the human drives), ``awaiting reset`` (the episode stopped;
    the go key starts the next: set by the session's reset hook), ``between episodes`` and ``done``
    (after :meth:`on_run_end`). Hooks only store a few fields; :meth:`line`
    and :attr:`state` may be read from any thread.

    Args:
        bus: the host's event bus (read for ``paused`` and ``quit``).
        controller: the key controller, for the takeover and keyed label (optional).
        keys: the bindings shown (default: the controller's).
        stream: when given, a line ``teleop: <state>`` is printed there each time the state changes.
    """

    def __init__(
        self, bus: EventBus, controller: KeyController | None = None, keys: TeleopKeys | None = None, stream=None
    ):
        self.bus, self.controller, self.stream = bus, controller, stream
        self.help = (keys or (controller.keys if controller is not None else TeleopKeys())).help_line()
        self._phase = "waiting"
        self._episode: int | None = None
        self._steps = 0
        self._human = False
        self.last_stop: str | None = None
        """The stop reason of the last finished episode (``discarded`` for a dropped one)."""
        self._printed: str | None = None
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        """The state now (see the class docstring), with ``, quitting`` once quit was keyed."""
        if self._phase != "running":
            state = self._phase
        elif self.bus.paused:
            state = "paused"
        elif self.controller.intervening if self.controller is not None else self._human:
            state = "intervening"
        else:
            state = "running"
        return f"{state}, quitting" if self.bus.quit_requested and state != "done" else state

    def line(self) -> str:
        """One line: state, episode and step, keyed label, last stop reason, key help."""
        parts = [self.state]
        if self._episode is not None:
            parts.append(f"episode {self._episode} step {self._steps}")
        label = None if self.controller is None else self.controller.label
        if label is not None:
            parts.append("marked " + ("success" if label else "failure"))
        if self.last_stop is not None:
            parts.append(f"last stop {self.last_stop}")
        return " | ".join(parts + [self.help])

    def refresh(self) -> None:
        """Print the state if it changed (when printing); safe from any thread (a source's ``on_change``)."""
        if self.stream is None:
            return
        with self._lock:
            state = self.state
            if state != self._printed:
                self._printed = state
                print(f"teleop: {state}", file=self.stream, flush=True)

    def awaiting_reset(self) -> None:
        """The episode stopped; the host waits for the go key (the session's reset hook calls this)."""
        self._phase = "awaiting reset"
        self.refresh()

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._phase, self._episode, self._steps, self._human = "running", start.index, 0, False
        self.refresh()

    def on_step(self, step: StepEvent) -> None:
        self._steps = step.step + 1
        human = step.actor == ACTOR_HUMAN
        if human != self._human:
            self._human = human
            self.refresh()

    def on_episode_end(self, end: EpisodeEnd) -> None:
        self.last_stop = "discarded" if end.dropped and end.stop_reason == "discarded" else end.stop_reason
        self._phase = "between episodes"
        self.refresh()

    def on_run_end(self) -> None:
        self._phase = "done"
        self.refresh()
