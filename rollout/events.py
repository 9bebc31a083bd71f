"""External events: stop, pause, labels, interventions, discard and quit.

An :class:`EventBus` is the thread-safe mailbox between the episode host and
anything outside it (a keyboard listener, a terminal reader, an API call, a
test). Producers call its verbs from any thread; the host polls it on its own
thread: at every chunk boundary and before every env step it holds while
paused (nothing is stepped or launched), then takes a stop request, then the
intervention action; paced by a control period, it looks again once the wait
for the step's tick is over, so no step begins after a pause or a stop.
Labels and discard are taken when the episode finishes; ``quit`` is read by
the driver between episodes. The go key counts only while the driver awaits
reset (from :meth:`EventBus.expect_go` until :meth:`EventBus.wait_for_go` is
released): one pressed while an episode runs cannot skip the next reset.
"""

from __future__ import annotations

import threading

import numpy as np


class EventBus:
    """Thread-safe events for the host (poll side: the host thread only)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._stop: str | None = None
        self._label: bool | None = None
        self._takeover: np.ndarray | None = None
        self._paused = False
        self._discard = False
        self._quit = False
        self._go = False
        self._awaiting_go = False

    # -- producers (any thread) ---------------------------------------------
    def request_stop(self, reason: str = "event") -> None:
        """End the running episode at the next env step or boundary, with stop reason ``reason``."""
        with self._cond:
            self._stop = reason
            self._cond.notify_all()

    def mark(self, success: bool) -> None:
        """Label the running episode a success or a failure (overrides the env's flag)."""
        with self._cond:
            self._label = bool(success)

    def intervene(self, action: np.ndarray | None) -> None:
        """Take over the arm with ``action`` for following steps; ``None`` hands back to the policy.

        After a hand-back the policy resumes at the next chunk boundary, from the
        current observation (the rest of the chunk planned before the takeover is dropped).
        """
        with self._cond:
            self._takeover = None if action is None else np.asarray(action, dtype=np.float32).copy()

    def pause(self, paused: bool | None = None) -> bool:
        """Pause (True), resume (False) or toggle (None) the running episode; returns the new state."""
        with self._cond:
            self._paused = (not self._paused) if paused is None else bool(paused)
            self._cond.notify_all()
            return self._paused

    def discard(self) -> None:
        """Drop the running episode: it ends now and nothing of it reaches a recording (re-record it)."""
        with self._cond:
            self._discard = True
            self._stop = self._stop or "discarded"
            self._cond.notify_all()

    def quit(self) -> None:
        """Ask the driver to stop after the running episode (it still finishes and is recorded; releases :meth:`wait_for_go`)."""
        with self._cond:
            self._quit = True
            self._cond.notify_all()

    def go(self) -> None:
        """Start the next episode (releases :meth:`wait_for_go`); ignored unless the driver awaits reset."""
        with self._cond:
            if self._awaiting_go:
                self._go = True
                self._cond.notify_all()

    # -- the host's side (its thread only) -----------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def quit_requested(self) -> bool:
        return self._quit

    @property
    def awaiting_go(self) -> bool:
        """True while a go key would count (the driver awaits reset); may be read from any thread."""
        return self._awaiting_go

    def hold(self) -> None:
        """Block while paused; a stop, discard or quit ends the pause (the caller then polls the stop)."""
        if not self._paused:  # the usual case, read without the lock: a pause set meanwhile holds the next call
            return
        with self._cond:
            self._cond.wait_for(lambda: not self._paused or self._stop is not None or self._quit)

    def poll_stop(self) -> str | None:
        if self._stop is None:  # read without the lock (every step asks); a request set meanwhile is taken next time
            return None
        with self._cond:
            reason, self._stop = self._stop, None
        return reason

    def take_label(self) -> bool | None:
        with self._cond:
            label, self._label = self._label, None
        return label

    def take_discard(self) -> bool:
        with self._cond:
            discard, self._discard = self._discard, False
        return discard

    def intervention(self) -> np.ndarray | None:
        if self._takeover is None:  # read without the lock, as poll_stop
            return None
        with self._cond:
            return None if self._takeover is None else self._takeover.copy()

    def expect_go(self) -> None:
        """Await the go key from now on: a reset hook calls this before it asks the person to press it."""
        with self._cond:
            self._awaiting_go = True

    def wait_for_go(self, timeout: float | None = None) -> bool:
        """Block until :meth:`go` or :meth:`quit` (a teleop reset waits for a key); True if released.

        Awaits the go key from the call on (as :meth:`expect_go`) until released; a timeout keeps awaiting it.
        """
        with self._cond:
            self._awaiting_go = True
            released = self._cond.wait_for(lambda: self._go or self._quit, timeout)
            if released:
                self._go = self._awaiting_go = False
            return released

    def clear(self) -> None:
        """Forget the last episode's stop, label, takeover, pause, discard and go key (not quit); await no go key."""
        with self._cond:
            self._stop, self._label, self._takeover = None, None, None
            self._paused = self._discard = self._go = self._awaiting_go = False
