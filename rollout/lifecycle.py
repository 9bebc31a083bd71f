"""The host's lifecycle: its states and allowed transitions, its counters, the running episode's state.

``RESET -> RUNNING -> STOP_INFER -> AWAIT_RESET -> RECORD -> RESET`` (and
``CLOSED``); :class:`~rollcap.rollout.host.RolloutHost` moves along it and
refuses any other move. :class:`Bookkeeping` is the host's own capsule
component (episode, chunk and step counters); :class:`EpisodeState` what the
host keeps of the running episode (no per-step lists: events carry the data).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
    """The host's own state as a capsule component: its counters, in the capsule one int64 array ``counters``
    (episode, chunk, step).

    Held as Python ints (``episode``, ``chunk``, ``step``): a numpy element's ``+= 1`` costs ~0.6 us, and the host
    counts once a boundary and once a step (issue 57)."""

    __slots__ = ("episode", "chunk", "step")

    def __init__(self):
        self.episode = self.chunk = self.step = 0

    @property
    def counters(self) -> np.ndarray:
        """``[episode, chunk, step]``, a read-only copy (the host sets the attributes)."""
        out = self.live_state()["counters"]
        out.flags.writeable = False
        return out

    def live_state(self) -> dict[str, np.ndarray]:
        return {"counters": np.array((self.episode, self.chunk, self.step), dtype=np.int64)}

    def load_live_state(self, state) -> None:
        self.episode, self.chunk, self.step = (int(v) for v in state["counters"])

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


class Launched(NamedTuple):
    """What :meth:`RolloutHost.launch` hands to :meth:`RolloutHost.decide` (the boundary's two halves)."""

    noise: np.ndarray
    carried: object
    queue: Sequence[np.ndarray]
    obs: Observation
    step: int
    t0: float


def checked_noise(noise, shape: tuple[int, int]) -> np.ndarray:
    """A caller's noise for ``boundary(noise)``: a copy of a finite float32 ``shape`` array, else ValueError."""
    noise = np.asarray(noise)
    if noise.shape != shape or noise.dtype != np.float32:
        raise ValueError(f"boundary(noise): expected float32 {shape}, got {noise.dtype} {noise.shape}")
    if not np.isfinite(noise).all():
        raise ValueError(
            f"boundary(noise): non-finite values (NaN or inf) in {int((~np.isfinite(noise)).sum())} places"
        )
    return noise.copy()


def jsonable(d):
    """``d`` through JSON (tuples as lists, anything else unknown as its str)."""
    return json.loads(json.dumps(d, default=lambda o: list(o) if isinstance(o, tuple) else str(o)))


def fingerprints_of(policy, critic, state_env) -> dict:
    """An episode's fingerprints: the policy's, the critic's (if any), the exact-state env's (if it has one)."""
    fps = {"policy": policy.state_fingerprint()}
    if critic is not None:
        fps["critic"] = critic.state_fingerprint()
    if state_env is not None and hasattr(state_env, "state_fingerprint"):
        fps["env"] = state_env.state_fingerprint()
    return fps
