"""The driver's side of Ray actors that each drive N envs on batched graphs (``rollcap run --actors A --envs N``).

Each actor is a :class:`~rollcap.rollout.ray.episodes.RolloutActor` built at
batch N (``graphs`` G: G pairs at batch N/G), running the round in its slots.
One call (:meth:`~rollcap.rollout.ray.episodes.RolloutActor.stream`, a Ray
streaming generator) takes a list of ``(index, seed)`` specs and runs them in
the round's slots, a slot starting the next spec as soon as its episode ends,
and sends each episode back as it ends (its record, or in a sharded run its
receipt after writing it to the shard).

The driver (:func:`stream_batches`) cuts the run's specs into calls of
:func:`call_size` episodes, one call per actor at a time. When an actor dies
(its process, or its node) the episodes of its call that had not come back go
back to the queue, in two halves, so an episode that keeps killing its actor
ends up alone and is the only one reported failed; the ones that came back are
kept (recorded, or named in the manifest) once. A sharded actor killed after
writing an episode and before sending it leaves a copy no manifest line names
(readers ignore it), as a batch-1 actor does.

Determinism: an episode's bytes are those of the same episode in an
in-process ``rollcap run --envs N`` (same ``graphs``): a row of a batched
replay depends on its own inputs and the batch only, not on the other rows or
which row it is (:mod:`rollcap.rollout.batch`), and each actor captures at the
run's batch. The batch is in the policy's and critic's fingerprint, so
``rollcap replay`` rebuilds the runners at it.

Imports point downward: this module knows ``ray.episodes``; :func:`stream_batches` runs on an
:class:`~rollcap.rollout.ray.actors.ActorPool`'s scheduling loop (replacements,
drops, ``failed``, ``retries``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from rollcap.rollout.ray.episodes import EpisodeSpec

CALLS_PER_ENV = 2
"""Episodes a call gives each of an actor's envs (at most): more fill the slots better at a call's tail, fewer lose less to a dead actor."""


def call_size(episodes: int, actors: int, envs: int) -> int:
    """Episodes per call: ``CALLS_PER_ENV * envs``, fewer when that would leave actors without work."""
    return max(1, min(CALLS_PER_ENV * envs, math.ceil(episodes / max(actors, 1))))


def spec_batches(specs: Sequence[EpisodeSpec], size: int) -> list[tuple[EpisodeSpec, ...]]:
    """``specs`` cut into calls of at most ``size``, each of one config (a call runs on one batched core)."""
    out: list[list[EpisodeSpec]] = []
    for spec in specs:
        if out and len(out[-1]) < size and out[-1][0].config == spec.config:
            out[-1].append(spec)
        else:
            out.append([spec])
    return [tuple(b) for b in out]


def halves(batch: tuple) -> list[tuple]:
    """A lost call's specs as two calls (one when it held one episode)."""
    h = (len(batch) + 1) // 2
    return [batch] if len(batch) < 2 else [batch[:h], batch[h:]]


# ------------------------------------------------------------ the driver
def stream_batches(
    pool, specs: Iterable[EpisodeSpec], max_tries: int, recorded: bool = False
) -> Iterator[tuple[EpisodeSpec, object]]:
    """Run ``specs`` on ``pool``'s batched actors, :func:`call_size` episodes a call; yield ``(spec, answer)`` as each episode comes back.

    ``answer``: the record, or with ``recorded`` the actor's ``(light record, receipt)``. On the pool's one
    scheduling loop (:meth:`~rollcap.rollout.ray.actors.ActorPool.schedule`, as every Ray source): one call
    per ready actor at a time; a dead actor is replaced; a call that fails sends the episodes it had not
    answered back to the front of the queue (in :func:`halves`); an episode in ``max_tries`` failed calls
    goes to ``pool.failed``; with no live actor left the rest do too.
    """
    specs = list(specs)
    units = spec_batches(specs, call_size(len(specs), sum(s.live for s in pool.slots), pool.envs))

    def start(handle, batch: tuple[EpisodeSpec, ...]):
        call = handle.stream.options(num_returns="streaming")
        return call.remote([(s.index, s.seed) for s in batch], batch[0].config, recorded)

    return pool.schedule(units, start, lambda ep: ep.index, max_tries, streaming=True, split=halves)
