"""A session: one set of live components and a bounded timeline of their boundaries.

``Session.snapshot`` appends a capsule to the timeline (the oldest falls off
once ``max_boundaries`` are kept); :func:`rollback` restores an earlier
boundary of the same session. The session decides nothing about *when* to
snapshot; the caller (the rollout host) does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from rollcap.capsule.capsule import Capsule
from rollcap.capsule.errors import UnknownBoundary
from rollcap.capsule.protocol import Stateful
from rollcap.capsule.verbs import _check_components, restore, snapshot


class Session:
    """A bounded history of boundaries of one set of components.

    Args:
        components: name -> live component; every snapshot and rollback covers all.
        max_boundaries: how many boundaries are kept (oldest dropped first).
        tier: where the history's capsules live (``"device"`` or ``"host"``).

    Single-threaded: snapshot and roll back from the thread that drives the
    components, between replays.
    """

    def __init__(self, components: Mapping[str, Stateful], max_boundaries: int = 16, tier: str = "device"):
        _check_components(components)
        if isinstance(max_boundaries, bool) or not isinstance(max_boundaries, int) or max_boundaries < 1:
            raise ValueError(f"max_boundaries must be an int >= 1, got {max_boundaries!r}")
        if tier not in ("device", "host"):
            raise ValueError(f"session tier must be 'device' or 'host', got {tier!r}")
        self.components = dict(components)
        self.max_boundaries = max_boundaries
        self.tier = tier
        self._history: deque[tuple[int, Capsule]] = deque(maxlen=max_boundaries)
        self._next_id = 0

    def snapshot(self, label: str = "", **meta: Any) -> Capsule:
        """Capture the components now and append the boundary to the history.

        Args:
            label: boundary label (also usable to name it in :meth:`rollback`).
            **meta: ``episode``, ``chunk``, ``step``, ``extra`` (see :func:`snapshot`).

        Returns:
            The capsule; its id in this session is ``session.ids[-1]``.
        """
        capsule = snapshot(self.components, label, tier=self.tier, **meta)
        self._history.append((self._next_id, capsule))
        self._next_id += 1
        return capsule

    @property
    def ids(self) -> list[int]:
        """Ids of the kept boundaries, oldest first (ids count up from 0 and are never reused)."""
        return [i for i, _ in self._history]

    @property
    def boundaries(self) -> list[Capsule]:
        """The kept capsules, oldest first."""
        return [c for _, c in self._history]

    def __len__(self) -> int:
        return len(self._history)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for _, c in self._history)

    def _find(self, boundary: int | str | Capsule) -> int:
        """Position in the history of a boundary given by id, label (latest wins) or capsule."""
        for pos in range(len(self._history) - 1, -1, -1):
            sid, cap = self._history[pos]
            if isinstance(boundary, Capsule):
                hit = cap is boundary
            elif isinstance(boundary, str):
                hit = cap.label == boundary
            else:
                hit = sid == boundary
            if hit:
                return pos
        kept = ", ".join(f"{i}:{c.label!r}" for i, c in self._history) or "none"
        raise UnknownBoundary(
            f"boundary {boundary!r} is not in this session's history (kept: {kept}; at most {self.max_boundaries}); snapshot more often or raise max_boundaries"
        )

    def get(self, boundary: int | str | Capsule) -> Capsule:
        """The capsule of a kept boundary (by id, label or the capsule itself)."""
        return self._history[self._find(boundary)][1]

    def rollback(self, boundary: int | str | Capsule, *, truncate: bool = True) -> Capsule:
        """Restore an earlier boundary of this session (see :func:`rollback`)."""
        pos = self._find(boundary)
        capsule = self._history[pos][1]
        restore(capsule, self.components)
        if truncate:
            while len(self._history) > pos + 1:
                self._history.pop()
        return capsule

    def clear(self) -> None:
        """Forget every boundary (frees their memory)."""
        self._history.clear()


def rollback(session: Session, boundary: int | str | Capsule, *, truncate: bool = True) -> Capsule:
    """Restore an earlier boundary of ``session`` into its live components.

    Args:
        session: the session whose history holds the boundary.
        boundary: its id (``session.ids``), its label (the latest one with
            that label) or the capsule itself.
        truncate: forget the boundaries after it (they belong to the
            abandoned future); the rolled-back-to boundary stays kept.

    Returns:
        The restored capsule.

    Raises:
        UnknownBoundary: the boundary is not (or no longer) kept.
    """
    return session.rollback(boundary, truncate=truncate)
