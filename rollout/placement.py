"""Placements: where a run's slots live, and so where its episodes are recorded; one contract for them all.

```
placement.identity   what the episodes are made with: the resolved host config and the models (resume's check,
                     the actors' check)
placement.elsewhere  the episodes run on other machines (Ray actors): a resume compares the settings table only
placement.start(subscribers, shards, poll_stop)
                     the expensive part of start-up (processes, actors, a terminal); ``poll_stop`` between its steps
placement.episodes(todo)
                     ``(index, seed)`` pairs; yields each EpisodeEnd as it finishes (any order), after the subscribers had it
placement.close()    abandon what runs, stop what ``start`` started (idempotent; safe when ``start`` failed or never ran)
placement.summary()  what it adds to summary.json
```

Making a placement costs nothing (no process, no actor, no terminal); ``start``
does the rest. ``shards``: the run's manifest when the run is recorded where its
episodes are stepped (env workers, Ray actors that write shards), else None:
this process records them through a writer among ``subscribers``. Every
placement runs the same round (:mod:`rollcap.rollout.batch`); one in a person's
hands (teleop) runs the host's own driver, one episode at a time.

The placements: :class:`InProcess` (here, at any batch), the teleop one
(:mod:`rollcap.rollout.teleop.placement`), env workers
(:class:`rollcap.rollout.workers.core.EnvWorkersPlacement`) and Ray actors
(:mod:`rollcap.rollout.ray.placement`); :func:`rollcap.rollout.api.placement_for`
picks one from the spec. ``tests/rollout/test_placement.py`` fails on a placement
that drifts from this contract.

Imports point downward: ``batch``, ``build`` (what a build made), ``config``, ``host``, ``protocols``, ``spec``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rollcap.rollout.batch import Round, round_here
from rollcap.rollout.build import Built
from rollcap.rollout.config import HostConfig
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.spec import Spec


@dataclass(frozen=True)
class Identity:
    """What a run's episodes are made with: the host config as its hosts resolve it, and the policy and critic
    (one graph of them: every graph has the same weights and batch)."""

    config: HostConfig
    policy: object
    critic: object

    @classmethod
    def of(cls, spec: Spec, built: Built) -> Identity:
        policy, critic = built.policies[0], built.critics[0] if built.critics else None
        return cls(spec.host.for_policy(policy), policy, critic)


class Placement(ABC):
    """Where a run's slots live and its episodes are recorded (see the module docstring for the contract)."""

    elsewhere: ClassVar[bool] = False
    """The episodes run on other machines, whose versions and CPU this process cannot speak for."""

    def __init__(self, spec: Spec, built: Built):
        """Cheap: nothing starts here (:meth:`start` does)."""
        self.spec, self.built = spec, built
        self.identity = Identity.of(spec, built)

    @abstractmethod
    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """Start what runs the episodes; ``shards``: the run's ``ManifestWriter`` when the episodes are recorded
        where they are stepped, else None (a writer is among ``subscribers``). Raises to stop start-up."""

    @abstractmethod
    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Run the ``(index, seed)`` episodes; yield each end once the subscribers had it (in the order they end)."""

    @abstractmethod
    def close(self) -> None:
        """Abandon what runs (not recorded) and stop what :meth:`start` started; idempotent."""

    def summary(self) -> dict:
        """What the placement adds to ``summary.json``."""
        return {}

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InProcess(Placement):
    """Every slot in this process: the round at the run's batch (one slot over plain runners at batch 1; a
    :class:`~rollcap.rollout.batch.BatchedCore` at N), recorded by a writer among the subscribers."""

    def __init__(self, spec: Spec, built: Built):
        super().__init__(spec, built)
        self.round: Round | None = None

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        b = self.built
        self.round = round_here(b.envs, b.policies, b.critics, self.spec.host, subscribers)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.round.episodes(todo)

    def close(self) -> None:
        """The episodes running are abandoned; the envs and runners are the build's (it closes them)."""
        if self.round is not None:
            self.round.abort()
