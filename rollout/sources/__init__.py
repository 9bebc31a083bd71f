"""Episode sources: where a run's episodes come from, behind one protocol.

```
source.episodes(todo)   todo: (index, seed) pairs; yields each EpisodeEnd as it finishes (any order),
                        after the run's subscribers had it (the sink's writer among them)
source.host             the driver's host: the resolved config and the models (resume's checks, actors' identity)
source.start()          the expensive part of start-up (Ray actors); the run's start-up polls between steps
source.close()          abandon what runs, stop what it started (idempotent)
source.summary()        what it adds to summary.json
```

One file per way of running: :mod:`.local` (in this process at batch 1),
:mod:`.batched` (N envs over one graph), :mod:`.workers` (those N envs in worker
processes, each recording its shard), :mod:`.teleop` (a person in the loop),
:mod:`.actors` (Ray actors; the driver records what they send) and
:mod:`.shards` (Ray actors that record their own shards). The Ray ones share one
retry skeleton (:meth:`rollcap.rollout.ray.actors.ActorPool.map`). :func:`open_source`
picks one from the spec, as :func:`rollcap.rollout.recording.sinks.open_sink` picks
the sink.

A new way of running is one more file here with those five members, and one
more branch in :func:`open_source`, as the env workers are (:mod:`.workers`, over
:class:`~rollcap.rollout.workers.core.EnvWorkers`' ``episodes(todo)``, recording
where they step, with the ``shards`` sink).
"""

from __future__ import annotations

from rollcap.rollout.build import Built
from rollcap.rollout.recording.sinks import Sink
from rollcap.rollout.sources.actors import ActorSource
from rollcap.rollout.sources.batched import BatchedSource
from rollcap.rollout.sources.local import LocalSource
from rollcap.rollout.sources.shards import ShardSource
from rollcap.rollout.sources.teleop import TeleopSource
from rollcap.rollout.sources.workers import WorkerSource
from rollcap.rollout.spec import Spec

__all__ = ["ActorSource", "BatchedSource", "LocalSource", "ShardSource", "TeleopSource", "WorkerSource", "open_source"]


def open_source(
    spec: Spec, built: Built, sink: Sink, subscribers: list, env_meta: dict, spare_from: int = 0, poll_stop=None
):
    """The source ``spec`` asks for, over what :func:`~rollcap.rollout.build.build` made; its host is built here.

    ``subscribers``: the run's (the sink's writer included); a Ray source hands each episode to the list as
    it is when the episode arrives (the progress bar joins once the actors are up). ``spare_from``: the
    first index a teleop retry may take (after the run's own). ``poll_stop``: called while env workers start.
    """
    run = spec.run
    if run.env_workers:
        return WorkerSource(spec, built, sink, subscribers, env_meta, poll_stop)
    if run.actors:
        if sink.sharded:
            return ShardSource(spec, built, sink, subscribers, env_meta)
        return ActorSource(spec, built, subscribers)
    if run.teleop is not None:
        return TeleopSource(spec, built, subscribers, spare_from)
    if built.batched:
        return BatchedSource(spec, built, subscribers)
    return LocalSource(spec, built, subscribers)
