"""External events: stop requests, success/failure labels and interventions.

An :class:`EventBus` is the thread-safe mailbox between the episode host and
anything outside it (a keyboard listener, an API call, a test). The host polls
it once per env step (stop, label) and once per step for an intervention
action; producers call its methods from any thread.
"""

from __future__ import annotations

import threading

import numpy as np


class EventBus:
    """Thread-safe events for the host (poll side: the host thread only)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stop: str | None = None
        self._label: bool | None = None
        self._takeover: np.ndarray | None = None

    def request_stop(self, reason: str = "event") -> None:
        """Ask the running episode to stop at the next step (reason recorded as ``event:<reason>``)."""
        with self._lock:
            self._stop = reason

    def mark(self, success: bool) -> None:
        """Label the running episode a success or a failure (overrides the env's flag)."""
        with self._lock:
            self._label = bool(success)

    def intervene(self, action: np.ndarray | None) -> None:
        """Take over the arm with ``action`` for following steps; ``None`` hands back to the policy."""
        with self._lock:
            self._takeover = None if action is None else np.asarray(action, dtype=np.float32).copy()

    def poll_stop(self) -> str | None:
        with self._lock:
            reason, self._stop = self._stop, None
        return None if reason is None else f"event:{reason}"

    def take_label(self) -> bool | None:
        with self._lock:
            label, self._label = self._label, None
        return label

    def intervention(self) -> np.ndarray | None:
        with self._lock:
            return None if self._takeover is None else self._takeover.copy()

    def clear(self) -> None:
        with self._lock:
            self._stop, self._label, self._takeover = None, None, None
