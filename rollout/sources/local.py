"""The in-process source at batch 1: one :class:`~rollcap.rollout.host.RolloutHost`, one episode at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rollcap.rollout.build import Built
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.spec import Spec


class LocalSource:
    """Episodes run one after the other on this thread (see :mod:`rollcap.rollout.sources`)."""

    def __init__(self, spec: Spec, built: Built, subscribers: list, **host_options):
        self.host = RolloutHost(built.env, built.policy, built.critic, spec.host, subscribers, **host_options)

    def start(self) -> None:
        pass

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return (self.host.run_episode(index, seed) for index, seed in todo)

    def close(self) -> None:
        self.host.abort()

    def summary(self) -> dict:
        return {}
