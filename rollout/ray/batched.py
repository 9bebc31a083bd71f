"""Ray actors that each drive N envs on one batched graph (``rollcap run --actors A --envs N``).

:class:`BatchedRolloutActor` is a :class:`~rollcap.rollout.ray.episodes.RolloutActor`
whose parts are N envs and a policy and critic captured at batch N
(:func:`~rollcap.rollout.batch.make_batched_runners`; ``graphs`` G: G pairs at
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
``lifecycle`` and ``ray.episodes``; :func:`stream_batches` drives an
:class:`~rollcap.rollout.ray.actors.ActorPool`'s actors with the pool's own
bookkeeping (replacements, drops, ``failed``, ``retries``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from rollcap.rollout.batch import BatchedCore, make_batched_runners
from rollcap.rollout.build import Parts, make_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.ray.episodes import _SHIPPED, EpisodeSpec, RolloutActor, _one_line

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
        self.envs: list = []
        self.policy = self.critic = None
        self._cores: dict[HostConfig, BatchedCore] = {}
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
        runners = [r for part in (self.policy, self.critic) for r in (part if isinstance(part, list) else [part])]
        for part in runners + self.envs:
            if part is not None:
                part.close()


# ------------------------------------------------------------ the driver
def stream_batches(
    pool, specs: Iterable[EpisodeSpec], max_tries: int, recorded: bool = False
) -> Iterator[tuple[EpisodeSpec, object]]:
    """Run ``specs`` on ``pool``'s batched actors, :func:`call_size` episodes a call; yield ``(spec, answer)`` as each episode comes back.

    ``answer``: the record, or with ``recorded`` the actor's ``(light record, receipt)``. As
    :meth:`~rollcap.rollout.ray.actors.ActorPool.map`: one call per ready actor at a time;
    a dead actor is replaced; a call that fails sends the episodes it had not
    answered back to the front of the queue (in :func:`halves`); an episode in
    ``max_tries`` failed calls goes to ``pool.failed``; with no live actor left
    the rest do too.
    """
    ray = pool._ray
    specs = list(specs)
    todo = deque(spec_batches(specs, call_size(len(specs), sum(s.live for s in pool.slots), pool.envs)))
    tries: dict[int, int] = {}
    idle = [n for n, s in enumerate(pool.slots) if s.live and s.ready is None]
    busy: dict = {}  # a call's streaming generator -> (slot, {index: spec} not answered yet)

    def submit() -> None:
        while todo and idle:
            slot, batch = idle.pop(0), todo.popleft()
            gen = (
                pool.slots[slot]
                .handle.stream.options(num_returns="streaming")
                .remote([(s.index, s.seed) for s in batch], batch[0].config, recorded)
            )
            busy[gen] = (slot, {s.index: s for s in batch})

    def lost(slot: int, left: dict, err: BaseException) -> None:
        if isinstance(err, ray.exceptions.RayActorError):  # the actor process (or its node) died
            pool._replace(slot)
        else:
            idle.append(slot)
        again = []
        for index, spec in left.items():
            tries[index] = tries.get(index, 0) + 1
            if tries[index] >= max_tries:
                pool.failed[index] = _one_line(err)
            else:
                again.append(spec)
        if again:
            pool.retries += 1
            todo.extendleft(reversed(halves(tuple(again))))

    while todo or busy:
        submit()
        starting = {s.ready: n for n, s in enumerate(pool.slots) if s.live and s.ready is not None}
        if not busy and not idle and not starting:
            pool._no_actors_left([s.index for batch in todo for s in batch])
            return
        done, _ = ray.wait([*busy, *starting], num_returns=1, timeout=0.5)
        idle += pool._poll_starting(starting)
        for gen in done:
            if gen not in busy:
                continue  # a ready() call: handled by _poll_starting
            slot, left = busy[gen]
            try:
                index, answer = ray.get(next(gen))
            except StopIteration:  # the call is over
                del busy[gen]
                if left:  # it ended without answering for these (it should not)
                    lost(slot, left, RuntimeError(f"the actor's call ended without episodes {sorted(left)}"))
                else:
                    idle.append(slot)
                continue
            except ray.exceptions.RayError as err:
                del busy[gen]
                lost(slot, left, err)
                continue
            submit()
            yield left.pop(index), answer
