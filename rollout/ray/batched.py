"""Ray actors that each drive N envs on one batched graph (``rollcap run --actors A --envs N``).

:class:`BatchedRolloutActor` is a :class:`~rollcap.rollout.ray.episodes.RolloutActor`
whose parts are N envs and a policy and critic captured at batch N
(:func:`~rollcap.rollout.batch.make_batched_runners`; ``graphs`` G: G pairs at
batch N/G), driven by a :class:`~rollcap.rollout.batch.BatchedCore`. One call
(:meth:`~BatchedRolloutActor.run_batch`, or
:meth:`~BatchedRolloutActor.run_batch_recorded` for a sharded run) takes a list
of ``(index, seed)`` specs and runs them in the core's slots, a slot starting
the next spec as soon as its episode ends; it answers with every episode of the
call once the last one ends.

The pool (:meth:`~rollcap.rollout.ray.actors.ActorPool.map_batches`) cuts the
run's specs into calls of :func:`call_size` episodes. A call whose actor dies
(its process, or its node) is lost whole: none of its episodes reached the
driver, so none is in the manifest (a sharded actor may have written some to
its shard: no line names them, readers ignore them), and its episodes go back
to the queue in two halves, so an episode that keeps killing its actor ends up
alone and is the only one reported failed.

Determinism: an episode's bytes are those of the same episode in an
in-process ``rollcap run --envs N`` (same ``graphs``): a row of a batched
replay depends on its own inputs and the batch only, not on the other rows or
which row it is (:mod:`rollcap.rollout.batch`), and each actor captures at the
run's batch. The batch is in the policy's and critic's fingerprint, so
``rollcap replay`` rebuilds the runners at it.

Imports point downward: this module knows ``build``, ``batch``, ``config``,
``lifecycle`` and ``ray.episodes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

from rollcap.rollout.batch import BatchedCore, make_batched_runners
from rollcap.rollout.build import Parts, make_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.ray.episodes import _SHIPPED, EpisodeSpec, RolloutActor

CALLS_PER_ENV = 2
"""Episodes a call gives each of an actor's envs (at most): more fill the slots better at a call's tail, fewer lose less to a dead actor."""


def call_size(episodes: int, actors: int, envs: int) -> int:
    """Episodes per call: ``CALLS_PER_ENV * envs``, fewer when that would leave actors without work."""
    return max(1, min(CALLS_PER_ENV * envs, math.ceil(episodes / max(actors, 1))))


def spec_batches(specs: Sequence[EpisodeSpec], size: int) -> list[tuple[EpisodeSpec, ...]]:
    """``specs`` cut into calls of at most ``size``, each of one config (a call runs on one core)."""
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


class _SeededCore(BatchedCore):
    """A :class:`BatchedCore` whose ``todo`` items are ``(index, seed)``: an actor runs the seeds it is given."""

    def _refill(self, todo: Iterator[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        for h in self.hosts:  # as BatchedCore._refill, with the spec's seed
            while h.state is not HostState.RUNNING:
                if h.state is HostState.STOP_INFER:
                    yield h.finish()
                    continue
                spec = next(todo, None)
                if spec is None:
                    break
                h.start(*spec)


class BatchedRolloutActor(RolloutActor):
    """``envs`` envs and runners captured at batch ``envs`` (``graphs`` pairs at ``envs // graphs``); runs a list of episodes per call.

    A plain class, as :class:`RolloutActor` (``ray.remote`` makes it an actor;
    tests use it without Ray). :meth:`run` and :meth:`run_recorded` still run
    one episode (in one slot; the others idle).
    """

    def __init__(self, parts: Parts, config: HostConfig, shipped: tuple[str, ...] = (), envs: int = 2, graphs: int = 1):
        parts = replace(parts, **{k: _SHIPPED[k] for k in shipped})
        self.envs: list = []
        self.policy = self.critic = None
        self._cores: dict[HostConfig, _SeededCore] = {}
        self._hosts = {}
        try:
            for _ in range(envs):
                self.envs.append(make_env(parts.env_id, parts.env_kwargs))
            self.policy, self.critic = make_batched_runners(parts, envs, self.envs[0], graphs=graphs)
            self.env = self.envs[0]
            self.core(config)
        except BaseException:
            self.close()
            raise

    def core(self, config: HostConfig | None = None) -> _SeededCore:
        """The batched core for ``config`` (default: the first; built on first use, on the same envs and runners)."""
        if config is None:
            return next(iter(self._cores.values()))
        if config not in self._cores:
            core = self._cores[config] = _SeededCore(self.envs, self.policy, self.critic, config)
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

    def run_batch_recorded(self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None) -> list[tuple[EpisodeRecord, dict]]:
        """As :meth:`run_batch`, each episode recorded in this actor's shard as it ends; return ``(light record, receipt)`` pairs
        (see :meth:`RolloutActor.run_recorded`)."""
        return [self.recorded(end.record) for end in self.episodes(specs, config)]

    def run(self, index: int, seed: int, config: HostConfig | None = None) -> EpisodeRecord:
        (record,) = self.run_batch([(index, seed)], config)
        return record

    def close(self) -> None:
        shard = getattr(self, "_shard", None)
        if shard is not None:
            shard[1].close()
        for core in self._cores.values():
            core.close_pool()
        runners = [r for part in (self.policy, self.critic) for r in (part if isinstance(part, list) else [part])]
        for part in runners + self.envs:
            if part is not None:
                part.close()
