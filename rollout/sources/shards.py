"""The Ray shards source: actors record each episode in their own shard; the driver writes the manifest line.

(:mod:`rollcap.rollout.ray.shards`: exactly once, per-node shard directories.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rollcap.rollout.build import Built
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.ray.shards import Shards
from rollcap.rollout.recording.sinks import Sink
from rollcap.rollout.sources.actors import ActorSource
from rollcap.rollout.spec import Spec


class ShardSource(ActorSource):
    """Ray actors that record their episodes themselves, into the sink's manifest (see :mod:`rollcap.rollout.sources`)."""

    def __init__(self, spec: Spec, built: Built, sink: Sink, subscribers: list, env_meta: dict):
        super().__init__(spec, built, subscribers)
        self.manifest = sink.recorder
        self.shards = Shards(sink.recorder, env_meta, spec.run.shard_dir)

    def start(self, setup=None, poll_stop=None) -> None:
        super().start(setup=self.shards.setup, poll_stop=poll_stop)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.shards.episodes(self.pool, todo, self.subscribers)
