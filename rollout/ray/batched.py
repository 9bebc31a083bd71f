"""Ray actors that each drive N envs on one batched graph (``rollcap run --actors A --envs N``).

:class:`BatchedRolloutActor` is a :class:`~rollcap.rollout.ray.episodes.RolloutActor`
whose parts are N envs and a policy and critic captured at batch N
(:func:`~rollcap.rollout.build.build`; ``graphs`` G: G pairs at
batch N/G), driven by a :class:`~rollcap.rollout.batch.BatchedCore`. One call
(:meth:`~BatchedRolloutActor.stream`, a Ray streaming generator) takes a list of
``(index, seed)`` specs and runs them in the core's slots, a slot starting the
next spec as soon as its episode ends, and sends each episode back as it ends
(its record, or in a sharded run its receipt after writing it to the shard).

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

Imports point downward: this module knows ``build``, ``batch``, ``config``,
``spec`` and ``ray.episodes``; :func:`stream_batches` runs on an
:class:`~rollcap.rollout.ray.actors.ActorPool`'s scheduling loop (replacements,
drops, ``failed``, ``retries``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import build
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.ray.episodes import _SHIPPED, EpisodeSpec, RolloutActor
from rollcap.rollout.spec import Parts, RunConfig, Spec

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


class BatchedRolloutActor(RolloutActor):
    """``envs`` envs and runners captured at batch ``envs`` (``graphs`` pairs at ``envs // graphs``); runs a list of episodes per call.

    A plain class, as :class:`RolloutActor` (``ray.remote`` makes it an actor;
    tests use it without Ray). :meth:`run` and :meth:`run_recorded` still run
    one episode (in one slot; the others idle).
    """

    def __init__(self, parts: Parts, config: HostConfig, shipped: tuple[str, ...] = (), envs: int = 2, graphs: int = 1):
        parts = replace(parts, **{k: _SHIPPED[k] for k in shipped})
        self._cores: dict[HostConfig, BatchedCore] = {}
        self._hosts = {}
        self._built = build(Spec(parts, config, RunConfig(envs=envs, graphs=graphs, env_workers=0)), check_env=False)
        self.envs, self.policy, self.critic, self.env = (
            self._built.envs,
            self._built.policy,
            self._built.critic,
            self._built.env,
        )
        try:
            self.core(config)
        except BaseException:
            self.close()
            raise

    def core(self, config: HostConfig | None = None) -> BatchedCore:
        """The batched core for ``config`` (default: the first; built on first use, on the same envs and runners)."""
        if config is None:
            return next(iter(self._cores.values()))
        if config not in self._cores:
            core = self._cores[config] = BatchedCore(self.envs, self.policy, self.critic, config)
            self._hosts[config] = core.hosts[0]  # what ready() names (identity: the resolved config, the weights)
        return self._cores[config]

    def host(self, config: HostConfig):
        return self.core(config).hosts[0]

    def episodes(self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None) -> Iterator[EpisodeEnd]:
        """Run ``(index, seed)`` specs in the core's slots; yield each end (record attached) as it finishes."""
        return self.core(config).episodes(iter([(int(i), int(s)) for i, s in specs]))

    def run_batch(self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None) -> list[EpisodeRecord]:
        """Run the episodes ``specs`` names; return their records in the order they ended."""
        return [end.record for end in self.episodes(specs, config)]

    def stream(
        self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None, recorded: bool = False
    ) -> Iterator[tuple[int, object]]:
        """Run ``specs``; yield ``(index, record)`` as each ends; ``recorded``: write it to this actor's shard first and yield
        ``(index, (light record, receipt))`` (see :meth:`RolloutActor.run_recorded`). Ray calls it with ``num_returns="streaming"``."""
        for end in self.episodes(specs, config):
            yield end.index, self.recorded(end.record) if recorded else end.record

    def run(self, index: int, seed: int, config: HostConfig | None = None) -> EpisodeRecord:
        (record,) = self.run_batch([(index, seed)], config)
        return record

    def close(self) -> None:
        shard = getattr(self, "_shard", None)
        if shard is not None:
            shard[1].close()
        for core in self._cores.values():
            core.close_pool()
        self._built.close()


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

    return pool.schedule(units, start, lambda spec: spec.index, max_tries, streaming=True, split=halves)
