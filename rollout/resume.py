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
  is exact for runners that carry nothing from one chunk to the next (a
  real-time-chunking runner carries its last chunk: not supported yet).

A resumed *run* (``rollcap run --resume``, appending episodes to a run) is
checked elsewhere: :func:`rollcap.rollout.offline.deployment.check_same_run`.

Imports point downward: this module knows ``protocols`` only.
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
    """Chunk boundaries passed before this one (``K``), counted from the root episode (a parent that
    itself began mid-way adds where it began)."""
    step: int
    """Env steps executed before this boundary, counted the same way."""
    origin: dict
    """Lineage, recorded with the new episode (JSON-able): parent file, episode, chunk, branch, noise, ..."""
    noise: np.ndarray | None = None
    """``[C, H, A]`` float32 noise for the new episode's first ``C`` chunks (the control branch: the
    parent's own); later chunks, and all of them when None, are derived from the episode seed."""
    prior_values: tuple[float, ...] = ()
    """The critic values at chunks ``0 .. K-1`` (same count), replayed into the stop predicates."""

    def __post_init__(self):
        if self.chunk < 0 or self.step < 0:
            raise ValueError(f"Resume: chunk and step must be >= 0, got {self.chunk} and {self.step}")
        if len(self.prior_values) != self.chunk:
            raise ValueError(
                f"Resume: prior_values holds {len(self.prior_values)} values, expected one per earlier chunk ({self.chunk})"
            )


ORIGIN_KEYS = ("parent", "episode", "chunk", "step", "branch", "noise", "prior_values", "offset")
"""What :attr:`Resume.origin` holds for a branch (see :mod:`rollcap.rollout.offline.branch`): ``chunk`` and ``step``
count in the parent's own episode; ``offset`` (only when the parent itself began mid-way) is where the
parent began, so the new episode's predicates count from ``offset + (chunk, step)``."""


@dataclass(frozen=True)
class Offset:
    """Where an episode began in its root episode's counts, and the root's critic values before that."""

    chunk: int = 0
    step: int = 0
    prior_values: tuple[float, ...] = ()


def offset_of(record) -> Offset:
    """Where ``record`` began (zero for an ordinary episode), from its ``origin``."""
    origin = record.origin
    if origin is None:
        return Offset()
    k0, t0 = origin.get("offset", (0, 0))
    return Offset(
        int(k0) + int(origin["chunk"]),
        int(t0) + int(origin["step"]),
        tuple(float(v) for v in origin.get("prior_values", ())),
    )


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
    from rollcap.rollout.protocols import observation_at

    noise = record.chunks["noise"] if origin.get("noise") == "parent" else None
    at = offset_of(record)
    return Resume(
        dict(record.initial_state),
        observation_at(record, 0),
        at.chunk,
        at.step,
        dict(origin),
        noise=noise,
        prior_values=at.prior_values,
    )
