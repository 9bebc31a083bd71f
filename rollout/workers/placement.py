"""A batched run's envs in env worker processes, each recording its episodes in its own shard of the run.

The graphs run here at the run's batch (what :func:`~rollcap.rollout.build.build` captured); the envs
live in ``env_workers`` processes (:class:`~rollcap.rollout.workers.core.EnvWorkers`, started in
:meth:`EnvWorkersPlacement.start`); each episode is named in the run's manifest (``shards``) once its
worker has written it. The same bytes as the in-process batched round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from rollcap.rollout.placement import Placement
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.workers.core import EnvWorkers


class EnvWorkersPlacement(Placement):
    """The slots in the workers' processes, the graphs here (see the module docstring)."""

    workers: EnvWorkers | None = None
    _open = False

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """Spawn the workers (``poll_stop`` is called while they start) and have each record into ``shards``."""
        if shards is None:
            raise ValueError("env workers record their episodes in shards of the run: give them its manifest")
        parts, b = self.spec.deployment, self.built
        self.workers = EnvWorkers(
            parts.env_id, parts.env_kwargs, b.policies, b.critics, self.spec.host, self.spec.run.env_workers,
            poll_stop=poll_stop,
        )  # fmt: skip
        self._open = True
        self.workers.record_to(shards, shards.env_meta, subscribers)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.workers.episodes(todo)

    def close(self) -> None:
        """What runs is abandoned (the ends already on their way are named in the manifest); the workers stop."""
        if self._open:
            self._open = False
            self.workers.abort()
            self.workers.close()

    def summary(self) -> dict:
        return {} if self.workers is None else self.workers.summary()
