"""Rewind a live episode to one of its last boundaries and retry from there with new noise.

:class:`RewindBuffer` is a subscriber: at every chunk boundary of the running
episode it snapshots the env's exact state into a capsule (the boundary's
state: no step has run since) and keeps the last ``max_boundaries`` of them in
a :class:`~rollcap.capsule.CapsuleRegistry` bounded in bytes (the oldest are
dropped first). :meth:`RewindBuffer.request` (from any thread: a key, a UI, an
API call) stops the episode through the host's event bus with stop reason
``"rewind"``; :func:`run_with_rewinds` then starts the retry at the chosen
boundary (:class:`~rollcap.rollout.resume.Resume`) with a seed from
:func:`~rollcap.rollout.seeding.retry_seed`.

What is recorded: the rewound episode as it ran, stop reason ``"rewind"``
(the segment after the chosen boundary is the discarded one), and the retry as
an episode of its own whose ``origin`` names the rewound episode, the boundary
(chunk and step) and ``"rewind": attempt``. Each replays exactly on its own:
the rewound one as an episode stopped from outside, the retry from its
recorded boundary, its noise from its seed.

Policy and critic state are the episode-initial capsule's at the retry, as for
branches (exact for runners that carry nothing across chunks).

Imports point downward: this module knows ``capsule``, ``protocols``, ``resume`` and ``seeding``.
"""

from __future__ import annotations

import threading
from collections import deque

from rollcap.capsule.registry import CapsuleRegistry, TierBudgets
from rollcap.capsule.verbs import snapshot
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.protocols import ChunkEvent, EpisodeStart, Subscriber
from rollcap.rollout.resume import Resume, offset_of
from rollcap.rollout.seeding import retry_seed

REWIND = "rewind"
"""The stop reason of a rewound episode."""


class RewindBuffer(Subscriber):
    """The last ``max_boundaries`` boundaries of the running episode, as capsules in a byte-bounded registry.

    :meth:`on` builds one and adds it to the host's subscribers. Hooks run on
    the host's thread; :meth:`request` may be called from any thread.

    Args:
        host: the :class:`~rollcap.rollout.host.RolloutHost` it serves (its env must have exact state).
        max_boundaries: boundaries kept (>= 1).
        budget_bytes: bytes of capsules kept; past it the oldest are dropped first.
    """

    def __init__(self, host, max_boundaries: int = 8, budget_bytes: int = 16 * 2**20):
        if host.state_env is None:
            raise ConfigError("env_id", f"{host.env_id} has no exact state; a live episode cannot be rewound")
        if max_boundaries < 1 or budget_bytes < 1:
            raise ValueError(
                f"RewindBuffer: max_boundaries and budget_bytes must be >= 1, got {max_boundaries}, {budget_bytes}"
            )
        self.host, self.max_boundaries = host, int(max_boundaries)
        self.registry = CapsuleRegistry(TierBudgets(device=int(budget_bytes), host=0, disk=0))
        self._kept: deque[int] = deque()
        self._boundary: dict[int, tuple] = {}  # chunk -> (obs, step)
        self._values: list[float] = []
        self._start: EpisodeStart | None = None
        self._lock = threading.Lock()
        self._back: int | None = None
        self.attempts = 0

    @classmethod
    def on(cls, host, max_boundaries: int = 8, budget_bytes: int = 16 * 2**20) -> RewindBuffer:
        """A buffer for ``host``, added to its subscribers (it sees every boundary from now on)."""
        buffer = cls(host, max_boundaries, budget_bytes)
        host.subscribers.append(buffer)
        return buffer

    # -- the operator's side --------------------------------------------------
    def request(self, back: int = 0) -> None:
        """Rewind the running episode to the boundary ``back`` chunks before the current one (0: retry this chunk).

        Stops the episode through the event bus (before its next step or launch)
        with stop reason ``"rewind"``; :func:`run_with_rewinds` starts the retry.
        """
        if back < 0:
            raise ValueError(f"rewind: back must be >= 0, got {back}")
        with self._lock:
            self._back = int(back)
        self.host.events.request_stop(REWIND)

    def resume_requested(self) -> Resume:
        """The retry's :class:`Resume` for the last rewind: :meth:`request`'s ``back``, or (a rewind key, which
        sends only the stop) the boundary before the running chunk when one is kept."""
        back = self.take_request()
        return self.resume(min(1, len(self.kept) - 1) if back is None else back)

    def take_request(self) -> int | None:
        """The pending request's ``back`` (None: none), cleared."""
        with self._lock:
            back, self._back = self._back, None
        return back

    @property
    def kept(self) -> list[int]:
        """Chunk indices of the boundaries kept now, oldest first."""
        return [k for k in self._kept if f"chunk{k}" in self.registry]

    # -- subscriber hooks -------------------------------------------------------
    def on_episode_start(self, start: EpisodeStart) -> None:
        for k in self._kept:
            if f"chunk{k}" in self.registry:
                self.registry.drop(f"chunk{k}")
        self._kept.clear()
        self._boundary.clear()
        self._values = []
        self._start = start

    def on_chunk(self, e: ChunkEvent) -> None:
        cap = snapshot(
            {"env": self.host.state_env}, label=f"boundary {e.chunk}", episode=e.episode, chunk=e.chunk, step=e.step
        )
        self.registry.put(f"chunk{e.chunk}", cap)
        self._kept.append(e.chunk)
        self._boundary[e.chunk] = (e.obs, e.step)
        while len(self._kept) > self.max_boundaries:
            old = self._kept.popleft()
            self._boundary.pop(old, None)
            if f"chunk{old}" in self.registry:
                self.registry.drop(f"chunk{old}")
        self._values.append(float(e.value))

    def close(self) -> None:
        self.registry.close()

    # -- the retry -------------------------------------------------------------
    def resume(self, back: int = 0) -> Resume:
        """The :class:`Resume` of the kept boundary ``back`` chunks before the latest one.

        Raises:
            ValueError: that boundary is not kept (too far back, or dropped by the byte budget).
        """
        kept = self.kept
        if self._start is None or not 0 <= back < len(kept):
            raise ValueError(
                f"rewind: {len(kept)} boundar{'y' if len(kept) == 1 else 'ies'} kept, cannot go {back} back (max_boundaries={self.max_boundaries})"
            )
        k = kept[-1 - back]
        cap = self.registry.get(f"chunk{k}")
        obs, step = self._boundary[k]
        s = self._start
        base = offset_of(s)  # the running episode may itself be a retry
        prior = base.prior_values + tuple(self._values[:k])
        self.attempts += 1
        origin = {
            "parent": "live",
            "episode": s.index,
            "chunk": k,
            "step": step,
            "rewind": self.attempts,
            "noise": "seed",
            "prior_values": list(prior),
        }
        if base.chunk or base.step:
            origin["offset"] = [base.chunk, base.step]
        state = {name: v.copy() for name, v in cap.buffers("env").items()}
        return Resume(state, obs, base.chunk + k, base.step + step, origin, prior_values=prior)


def run_with_rewinds(host, buffer: RewindBuffer, index: int, seed: int | None = None, next_index=None) -> list:
    """Run episode ``index``; each time it is rewound, run the retry as the next episode. Returns every :class:`EpisodeEnd`.

    Args:
        next_index: callable giving the index of each retry (default: one after the last).
    """
    ends = [host.run_episode(index, seed)]
    while ends[-1].stop_reason == REWIND:
        at = buffer.resume_requested()
        parent = ends[-1]
        new = next_index() if next_index is not None else parent.index + 1
        ends.append(host.run_episode(new, retry_seed(parent.seed, at.chunk, buffer.attempts), at))
    return ends
