"""The env workers source: a batched run's envs stepped in worker processes, each recording its own shard.

The graphs run here at batch N (what :func:`~rollcap.rollout.build.build` captured); the envs live in
``env_workers`` processes (:class:`~rollcap.rollout.workers.core.EnvWorkers`); the run's sink is the
shards' manifest. The same bytes as the in-process batched source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rollcap.rollout.build import Built
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.recording.sinks import Sink
from rollcap.rollout.spec import Spec
from rollcap.rollout.workers.core import EnvWorkers


class WorkerSource:
    """Episodes in the workers' slots (see :mod:`rollcap.rollout.sources`); the workers start here (``poll_stop``
    is called while they do) and record into the sink's manifest. ``host`` is the workers (config, runners)."""

    def __init__(self, spec: Spec, built: Built, sink: Sink, subscribers: list, env_meta: dict, poll_stop=None):
        parts, run = spec.deployment, spec.run
        self.host = EnvWorkers(
            parts.env_id, parts.env_kwargs, built.policy, built.critic, spec.host, run.env_workers, poll_stop=poll_stop
        )
        try:
            self.host.record_to(sink.recorder, env_meta, subscribers)
        except BaseException:
            self.host.close()
            raise
        self._open = True

    def start(self, poll_stop=None) -> None:
        pass

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.host.episodes(todo)

    def close(self) -> None:
        """What runs is abandoned (the ends already on their way are named in the manifest); the workers stop."""
        if self._open:
            self._open = False
            self.host.abort()
            self.host.close()

    def summary(self) -> dict:
        return self.host.summary()
