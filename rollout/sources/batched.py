"""The batched source: N envs in lockstep over one graph at batch N (:class:`~rollcap.rollout.batch.BatchedCore`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import Built
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.spec import Spec


class BatchedSource:
    """Each episode in the next free slot, each end as it finishes (see :mod:`rollcap.rollout.sources`)."""

    def __init__(self, spec: Spec, built: Built, subscribers: list):
        self.host = BatchedCore(built.envs, built.policy, built.critic, spec.host, subscribers)

    def start(self) -> None:
        pass

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.host.episodes(todo)

    def close(self) -> None:
        self.host.abort()

    def summary(self) -> dict:
        return {}
