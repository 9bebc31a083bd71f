"""The host's lifecycle: its states and allowed transitions, its counters, the running episode's state.

``RESET -> RUNNING -> STOP_INFER -> AWAIT_RESET -> RECORD -> RESET`` (and
``CLOSED``); :class:`~rollcap.rollout.host.RolloutHost` moves along it and
refuses any other move. :class:`Bookkeeping` is the host's own capsule
component (episode, chunk and step counters); :class:`EpisodeState` what the
host keeps of the running episode (no per-step lists: events carry the data).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from rollcap.rollout.protocols import Observation
from rollcap.rollout.resume import Resume


class HostState(enum.Enum):
    RESET = "reset"
    RUNNING = "running"
    STOP_INFER = "stop_infer"
    AWAIT_RESET = "await_reset"
    RECORD = "record"
    CLOSED = "closed"


ALLOWED = {
    HostState.RESET: {HostState.RUNNING, HostState.CLOSED},
    HostState.RUNNING: {HostState.STOP_INFER},
    HostState.STOP_INFER: {HostState.AWAIT_RESET},
    HostState.AWAIT_RESET: {HostState.RECORD},
    HostState.RECORD: {HostState.RESET},
    HostState.CLOSED: set(),
}

ON_ERROR = ("record", "drop", "raise")


class Bookkeeping:
    """The host's own state as a capsule component (counters)."""

    def __init__(self):
        self.counters = np.zeros(3, dtype=np.int64)  # episode, chunk, step

    def live_state(self) -> dict[str, np.ndarray]:
        return {"counters": self.counters}

    def load_live_state(self, state) -> None:
        self.counters[...] = state["counters"]

    def state_fingerprint(self) -> dict:
        return {"component": "host", "layout": "episode,chunk,step"}


@dataclass
class EpisodeState:
    """The running episode's host-side state (no per-step lists: events carry the data)."""

    index: int
    seed: int
    t_start: float
    obs: Observation | None = None
    chunk: int = 0
    steps: int = 0
    chunks: int = 0
    pending: np.ndarray | None = None
    """The last boundary's chunk, awaiting :meth:`RolloutHost.execute`."""
    inflight: int = 0
    """Real-time chunking: the carried actions the last boundary executed while inferring (execute starts at this index)."""
    started: bool = False
    """``on_episode_start`` was emitted."""
    human: bool = False
    """The last step was a human's (an intervention); the next policy step after it starts a new chunk."""
    success: bool = False
    stop_reason: str | None = None
    exception: BaseException | None = None
    at: Resume | None = None
    """Where a resumed episode began (its predicates see the parent's chunk and step counts)."""
