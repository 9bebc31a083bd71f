"""A run's episodes on Ray actors: each actor builds its own envs and runners and runs the round there.

The actors start in :meth:`ActorsPlacement.start` (:meth:`~rollcap.rollout.ray.actors.ActorPool.for_run`,
checked against this process's identity: the resolved config and the weights). Where the episodes are
recorded follows the run: with ``shards`` (the run's manifest) each actor writes its own shard and this
process names each episode in the manifest (:class:`~rollcap.rollout.ray.shards.Shards`); without, the
actors send each episode here and a writer among the subscribers records it. At ``envs`` N each actor
drives N envs on graphs at batch N (:mod:`rollcap.rollout.ray.batched`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from rollcap.rollout.build import Built
from rollcap.rollout.placement import Placement
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.ray.actors import ActorPool
from rollcap.rollout.ray.shards import Shards
from rollcap.rollout.spec import Spec


class ActorsPlacement(Placement):
    """The slots on a pool of Ray actors (see the module docstring)."""

    elsewhere = True

    def __init__(self, spec: Spec, built: Built):
        super().__init__(spec, built)
        self.pool: ActorPool | None = None
        self.shards: Shards | None = None
        self.subscribers: list[Subscriber] = []

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """Start the actors (each told its shard first, with ``shards``); ``poll_stop`` while Ray and they start."""
        self.subscribers = list(subscribers)
        if shards is not None:
            self.shards = Shards(shards, shards.env_meta, self.spec.run.shard_dir)
        setup = None if self.shards is None else self.shards.setup
        self.pool = ActorPool.for_run(self.spec, self.identity, setup=setup, poll_stop=poll_stop)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        if self.shards is not None:
            return self.shards.episodes(self.pool, todo, self.subscribers)
        return self.pool.episodes(todo, self.subscribers)

    def close(self) -> None:
        """The actors stop; an episode still running on one is not recorded."""
        if self.pool is not None:
            self.pool.close()

    def summary(self) -> dict:
        return {} if self.pool is None else self.pool.summary()
