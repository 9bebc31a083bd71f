"""The Ray actors source: each actor builds its own parts and runs episodes; the driver records what they send.

At ``envs`` N each actor drives N envs on one graph at batch N (:mod:`rollcap.rollout.ray.batched`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import Built
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.ray.actors import ActorPool
from rollcap.rollout.spec import Spec


class ActorSource:
    """Episodes on a pool of Ray actors (see :mod:`rollcap.rollout.sources`); :meth:`start` starts the pool.

    The driver's host (built on what :func:`~rollcap.rollout.build.build` made here) is the identity every
    actor must match: the resolved config and the weights.
    """

    def __init__(self, spec: Spec, built: Built, subscribers: list):
        self.spec, self.subscribers = spec, subscribers
        if built.batched:  # the driver's own N envs on its graphs at the actors' batch: what each actor resolves
            self.host = BatchedCore(built.envs, built.policy, built.critic, spec.host)
        else:
            self.host = RolloutHost(built.env, built.policy, built.critic, spec.host, [])
        self.pool: ActorPool | None = None

    def start(self, setup=None, poll_stop=None) -> None:
        self.pool = ActorPool.for_run(self.spec, self.host, setup=setup, poll_stop=poll_stop)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.pool.episodes(todo, self.subscribers)

    def close(self) -> None:
        """Actors stop; an episode still running on one is not recorded."""
        if self.pool is not None:
            self.pool.close()

    def summary(self) -> dict:
        return {} if self.pool is None else self.pool.summary()
