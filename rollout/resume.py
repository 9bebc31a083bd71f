"""Resume: where an episode that starts mid-way (a branch, a retry) begins.

:meth:`RolloutHost.start(index, seed, at=Resume(...)) <rollcap.rollout.host.RolloutHost.start>`
resets the env from the episode seed as usual, then puts the env's exact state
of a chunk boundary of another episode (the *parent*) in place and continues
from there. The new episode is recorded like any other, with its own steps and
chunks counted from 0, the boundary's state as its initial state, and
:attr:`Resume.origin` as its lineage (``EpisodeRecord.origin``), so it replays
on its own: :func:`resume_of` rebuilds the ``Resume`` from the record alone.

What a boundary's future depends on, and where each part comes from:

- the env's exact state (physics, RNG, task, step counters): ``env_state``;
- the observation the boundary sees: ``obs`` (the env has no "observe" call);
- the stop predicates' counters (a timeout counted in chunks, the critic's
  patience): the parent's chunk and step counts (``chunk``, ``step``) and the
  critic values of its earlier chunks (``prior_values``), replayed into the
  predicates;
- the policy's and critic's carried state: the episode-initial capsule, which
  is exact for runners that carry nothing from one chunk to the next (every
  runner today); ``capsule`` restores another one on top (a live rewind).

Imports point downward: this module knows ``capsule`` and ``protocols`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rollcap.rollout.protocols import Observation


@dataclass(frozen=True)
class Resume:
    """A chunk boundary of a parent episode to start a new episode at (see the module docstring)."""

    env_state: Mapping[str, np.ndarray]
    """The env's exact state at the boundary (``get_state()`` layout)."""
    obs: Observation
    """The observation the boundary sees (instruction included for dict observations)."""
    chunk: int
    """Chunk boundaries the parent passed before this one (``K``)."""
    step: int
    """Env steps the parent executed before this boundary."""
    origin: dict
    """Lineage, recorded with the new episode (JSON-able): parent file, episode, chunk, branch, noise, ..."""
    noise: np.ndarray | None = None
    """``[C, H, A]`` float32 noise for the new episode's first ``C`` chunks (the control branch: the
    parent's own); later chunks, and all of them when None, are derived from the episode seed."""
    prior_values: tuple[float, ...] = ()
    """The parent's critic values at chunks ``0 .. K-1``, replayed into the stop predicates."""
    capsule: object | None = None
    """A :class:`~rollcap.capsule.Capsule` of the host's components to restore after the
    episode-initial one (a live rewind); None: the episode-initial capsule only."""

    def __post_init__(self):
        if self.chunk < 0 or self.step < 0:
            raise ValueError(f"Resume: chunk and step must be >= 0, got {self.chunk} and {self.step}")
        if len(self.prior_values) != self.chunk:
            raise ValueError(f"Resume: prior_values holds {len(self.prior_values)} values, expected one per earlier chunk ({self.chunk})")


ORIGIN_KEYS = ("parent", "episode", "chunk", "step", "branch", "noise", "prior_values")
"""What :attr:`Resume.origin` holds for a branch (see :mod:`rollcap.rollout.branch`)."""


def resume_of(record) -> Resume | None:
    """The :class:`Resume` that re-runs a recorded resumed episode from its record alone (None: an ordinary episode).

    The boundary state is the record's initial state, its observation the
    record's first one; a control branch (``origin["noise"] == "parent"``) gets
    its recorded noise back, any other derives its noise from its seed again,
    so a replay checks that derivation too.
    """
    origin = record.origin
    if origin is None:
        return None
    from rollcap.rollout.replay import _obs_at

    noise = record.chunks["noise"] if origin.get("noise") == "parent" else None
    return Resume(
        dict(record.initial_state), _obs_at(record, 0), int(origin["chunk"]), int(origin["step"]), dict(origin),
        noise=noise, prior_values=tuple(float(v) for v in origin.get("prior_values", ())),
    )  # fmt: skip
