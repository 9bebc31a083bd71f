"""Stop predicates: small objects asked at every chunk boundary.

Each predicate sees a :class:`BoundaryView` (the chunk index, the raw policy
chunk, the critic value, elapsed time) *before* any action of the chunk
reaches the env, and returns a stop reason or ``None``. Env termination,
truncation, success and external events are checked per step by the host and
reported with the same reason names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollcap.kernels.finite import all_finite


@dataclass(frozen=True, init=False)
class BoundaryView:
    """What a predicate may look at.

    Frozen, with a written-out ``__init__`` (one a slot and boundary): it fills the instance dict, where a frozen
    dataclass's generated one sets each field through ``object.__setattr__`` (issue 57; as :class:`ChunkEvent`).
    """

    chunk: int
    """Index of the chunk about to execute (0-based)."""
    step: int
    """Env steps executed so far in the episode."""
    actions: np.ndarray
    """The raw policy chunk ``[H, A]``."""
    value: float
    """The critic's value of the current observation."""
    elapsed_s: float
    """Seconds since the episode began."""
    actions_finite: bool | None = None
    """True when the policy already knows every value of ``actions`` is finite (a batch's chunks checked at once, one
    check a replay: :class:`~rollcap.rollout.batch.RowPolicy`); None: not known, a predicate checks ``actions``."""

    def __init__(
        self,
        chunk: int,
        step: int,
        actions: np.ndarray,
        value: float,
        elapsed_s: float,
        actions_finite: bool | None = None,
    ):
        fields = self.__dict__  # (frozen: no setattr)
        fields["chunk"] = chunk
        fields["step"] = step
        fields["actions"] = actions
        fields["value"] = value
        fields["elapsed_s"] = elapsed_s
        fields["actions_finite"] = actions_finite


class StopPredicate:
    """Decides at a chunk boundary whether the episode stops.

    ``reset()`` is called at the start of every episode; ``check()`` once per
    boundary, in order, before the chunk executes.
    """

    def reset(self) -> None:
        """Forget per-episode state."""

    def check(self, view: BoundaryView) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError


class CriticBelow(StopPredicate):
    """Stop when the critic value is below ``threshold`` for ``patience`` consecutive chunks."""

    def __init__(self, threshold: float, patience: int = 1):
        if patience < 1:
            raise ValueError(f"--critic-patience: expected >= 1, got {patience}")
        self.threshold = float(threshold)
        self.patience = int(patience)
        self._run = 0

    def reset(self) -> None:
        self._run = 0

    def check(self, view: BoundaryView) -> str | None:
        self._run = self._run + 1 if view.value < self.threshold else 0
        return "critic" if self._run >= self.patience else None


class MaxChunks(StopPredicate):
    """Stop before chunk ``limit`` (a timeout counted in chunks)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"--max-chunks: expected >= 1, got {limit}")
        self.limit = int(limit)

    def check(self, view: BoundaryView) -> str | None:
        return "timeout_chunks" if view.chunk >= self.limit else None


class MaxSeconds(StopPredicate):
    """Stop once the episode has run ``limit`` wall-clock seconds (not replay-exact)."""

    def __init__(self, limit: float):
        if limit <= 0:
            raise ValueError(f"--max-seconds: expected > 0, got {limit}")
        self.limit = float(limit)

    def check(self, view: BoundaryView) -> str | None:
        return "timeout_seconds" if view.elapsed_s >= self.limit else None


class NonFiniteAction(StopPredicate):
    """Stop if the policy produced NaN or Inf (nothing non-finite reaches the env)."""

    def check(self, view: BoundaryView) -> str | None:
        return None if view.actions_finite or all_finite(view.actions) else "nonfinite_action"
