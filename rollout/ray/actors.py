"""Ray batch rollouts: a pool of actors and the plain call.

- :class:`ActorPool` starts ``N`` actors (a :class:`~rollcap.rollout.ray.episodes.RolloutActor`
  by default; replay and branch actors too), waits until each has built its
  parts, and runs work on them through the one scheduling loop
  (:meth:`ActorPool.schedule`: one call per ready actor at a time, the faults below).
- Where episodes are recorded is the caller's choice: the driver records what
  :meth:`ActorPool.run` returns (``InBackground(EpisodeRecorder)``, one writer,
  as a local run), or each actor records its own shard
  (:class:`~rollcap.rollout.ray.placement.Shards`) and the driver writes only the manifest.
- Determinism: an episode's recorded bytes depend on its spec and the runners'
  fingerprint only; each actor runs one episode at a time, unbatched, so which
  actor ran it and how many there were change only the timings (not digested).
  With ``envs`` N each actor drives N envs on graphs at batch N
  (:func:`~rollcap.rollout.ray.actors.stream_batches`): an episode's bytes are those of the
  in-process ``--envs N`` run, whichever actor and slot ran it.
- Faults: only an actor whose ``ready()`` has answered gets work. An actor that
  dies (its process, or its node) is replaced and its item goes back to the
  front of the queue for any live actor; a replacement that is not ready within
  ``replace_timeout_s`` (the cluster lost the node it needed) is dropped with one
  line on stderr and the run goes on with the actors it has; with none left the
  remaining items are failed with one line. An item that fails ``max_tries``
  times is reported in ``failed`` (``--resume`` runs it again). Ctrl-C stops
  the actors; finished episodes are kept (:func:`rollcap.rollout.api.run`).
- :meth:`ActorPool.schedule` runs units of work (a tuple of items each: one
  episode, a batched actor's list of episodes, a replay's or a branch's item) as
  one call per ready actor at a time, answers coming back as each item ends; a
  failed call's unanswered items go back to the front of the queue split as the
  caller says (a batched call in halves). :meth:`ActorPool.map` is its
  one-item-per-call form.
- Local by default, on 127.0.0.1 only: :func:`~rollcap.rollout.ray.connect.connect`.

Actors that each drive N envs on batched graphs (``rollcap run --actors A --envs N``): each is a
:class:`~rollcap.rollout.ray.episodes.RolloutActor` built at batch N (``graphs`` G: G pairs at batch N/G), running
the round in its slots. One call (:meth:`~rollcap.rollout.ray.episodes.RolloutActor.stream`, a Ray streaming
generator) takes a list of ``(index, seed)`` specs and runs them in the round's slots, a slot starting the next as
soon as its episode ends, and sends each episode back as it ends (its record, or in a sharded run its receipt).
:func:`stream_batches` cuts the run's specs into calls of :func:`call_size` episodes, one call per actor at a time;
when an actor dies the episodes of its call that had not come back go back to the queue in two halves, so an episode
that keeps killing its actor ends up alone and is the only one reported failed. A row of a batched replay depends on
its own inputs and the batch only, so an episode's bytes are those of the in-process ``--envs N`` run.

``ray`` is imported lazily (``pip install 'rollcap[ray]'``). Imports point
downward: this module knows ``build``, ``config``, ``host``, ``protocols``,
``episode`` and ``ray.episodes`` / ``ray.connect``; the entry points (``api``,
``ray.replay``, ``ray.placement``, ``branch``, the CLI, the benches) import it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from rollcap.rollout.ray import episodes  # names looked up at use: a test may put a dying actor in place

from rollcap.rollout.spec import LEROBOT_PREFIX, Parts, named_policy
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.placement import Identity
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.ray.connect import connect, import_ray, log_ray_to, lost_to_cluster, lost_while_starting, say_lost
from rollcap.rollout.ray.episodes import (
    _SHIPPED,
    EpisodeSpec,
    _one_line,
    _same_parts,
    emit,
    episode_specs,
    identity,
)

MAX_TRIES = 3
"""Tries per episode before it is reported failed (each try that kills its actor costs one)."""


def _episodes(keys: list, most: int = 8) -> str:
    """``episode 3`` / ``episodes 3, 5`` / ``episodes 3, 5, ... (12 in all)``."""
    keys = sorted(keys)
    shown = ", ".join(str(k) for k in keys[:most]) + (f", ... ({len(keys)} in all)" if len(keys) > most else "")
    return f"episode{'s' if len(keys) > 1 else ''} {shown}"


def what_runs_again(again: list, failed: list) -> str:
    """What a lost call's unanswered episodes become, for the lost line: run again, failed (out of tries), or none."""
    parts = [f"{_episodes(again)} run{'s' if len(again) == 1 else ''} again on a live actor"] if again else []
    parts += [f"{_episodes(failed)} failed"] if failed else []
    return ", ".join(parts) or "no episode of its call was left to run"


REPLACE_TIMEOUT_S = 60.0
"""How long a replacement actor may take to be placed and built before it is dropped (the node it needed may be gone)."""


@dataclass(frozen=True)
class ActorResources:
    """What Ray reserves for each actor."""

    cpus: float = 1.0
    gpus: float = 0.0


@dataclass
class _Slot:
    handle: object
    ready: object = None
    """The ``ready()`` call of a new actor, until it answers; only then does the actor get work."""
    info: dict = field(default_factory=dict)
    since: float = field(default_factory=time.monotonic)
    """When the actor was asked for."""
    number: int = 0
    """The pool's count of actors started when this one was (0, 1, ...; a replacement gets the next)."""

    @property
    def live(self) -> bool:
        return self.handle is not None


class ActorPool:
    """``num_actors`` Ray actors, each a :class:`RolloutActor` built from ``parts`` and ``config``.

    Starting it connects to Ray (:func:`connect`) and waits until every actor
    has built its parts. :meth:`episodes` runs specs on the actors and hands
    each finished episode to subscribers on this thread; :meth:`close` stops
    the actors and a Ray instance this pool started. Drive it from one thread.

    Args:
        expect: :func:`identity` of the driver's host; actors that resolve
            another config or load other weights are refused.
        start_timeout_s: how long to wait for the actors to be built (a
            cluster may have to grow first).
        actor_cls: :class:`RolloutActor` (None: the default, looked up at use: a test may put a dying
            actor in its place) or a subclass.
        setup: called with each new actor's handle and number (0, 1, ...;
            a replacement gets the next) before its ``ready()``: the actor runs
            the calls it makes first (e.g. telling it its shard).
        poll_stop: called while the pool starts (before Ray, and twice a second
            while actors build); raises to stop (the CLI acts there on a Ctrl-C
            it held), and the pool is closed.
        envs: envs per actor; > 1: each actor drives them on one graph captured at
            that batch (:func:`~rollcap.rollout.ray.actors.stream_batches`),
            and :meth:`run` sends it a list of episodes per call.
        graphs: with ``envs``: that many graphs per actor, each at batch ``envs // graphs``.
        ray_log: where Ray's own messages to this driver go (a run's ``ray.log``; None: kept), not the terminal.

    Attributes:
        replace_timeout_s: how long a replacement actor may take to be ready
            before it is dropped (:data:`REPLACE_TIMEOUT_S`).

    Raises:
        ConfigError: an actor could not start (naming the field when the
            actor's error names one), or actors ran other weights than
            ``expect`` (a checkpoint path naming another file on a node).
    """

    def __init__(  # noqa: PLR0913 - the pool's documented options
        self,
        parts: Parts,
        config: HostConfig,
        num_actors: int,
        address: str | None = None,
        resources: ActorResources = ActorResources(),
        expect: dict | None = None,
        start_timeout_s: float = 300.0,
        actor_cls: type | None = None,
        setup: Callable[[object, int], None] | None = None,
        poll_stop: Callable[[], None] | None = None,
        envs: int = 1,
        graphs: int = 1,
        ray_log: Path | None = None,
    ):
        if num_actors < 1:
            raise ConfigError("actors", f"expected an integer >= 1, got {num_actors!r}")
        self.config, self.resources = config, resources
        self.envs, self._batched = envs, (envs, graphs) if envs > 1 else ()
        actor_cls = actor_cls or episodes.RolloutActor
        self.parts, self._shipped = _portable(parts)
        self.address, self.retries, self.replaced, self.dropped = address, 0, 0, 0
        self.failed: dict[int, str] = {}
        self.slots: list[_Slot] = []
        self.nodes: set = set()
        self.replace_timeout_s = REPLACE_TIMEOUT_S
        self._setup, self._poll_stop, self._started = setup, poll_stop or (lambda: None), 0
        self._ray = None
        self._owned = False
        log_ray_to(ray_log)  # Ray's own messages to this driver: a file of the run (None: kept in memory)
        t0 = time.perf_counter()
        try:
            self._poll_stop()
            self._ray = import_ray()
            local_cpus = max(os.cpu_count() or 1, math.ceil(num_actors * resources.cpus)) if address is None else None
            self._owned = connect(address, local_cpus)
            self.ray_start_s = time.perf_counter() - t0
            self._poll_stop()
            self._check_resources()
            self._remote = self._ray.remote(actor_cls).options(
                num_cpus=resources.cpus, num_gpus=resources.gpus, max_restarts=0
            )
            self.slots = [self._new_slot() for _ in range(num_actors)]
            self._wait_ready(start_timeout_s, expect)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0

    @classmethod
    def for_run(cls, spec, made: Identity, setup=None, poll_stop=None) -> ActorPool:
        """The pool a run's :class:`~rollcap.rollout.spec.Spec` asks for, every actor checked against ``made``
        (this process's resolved config and models: :attr:`~rollcap.rollout.placement.Placement.identity`)."""
        parts, cfg = spec.deployment, spec.run
        gpus = (
            cfg.actor_gpus
            if cfg.actor_gpus is not None
            else (0.0 if parts.device.startswith("cpu") else 1.0 / cfg.actors)
        )
        return cls(
            parts,
            made.config,
            cfg.actors,
            cfg.address,
            ActorResources(cfg.actor_cpus, gpus),
            identity(made),
            setup=setup,
            poll_stop=poll_stop,
            envs=cfg.envs,
            graphs=cfg.graphs,
            ray_log=None if cfg.out is None else Path(cfg.out) / "ray.log",
        )

    # -- start-up --------------------------------------------------------
    def _new_slot(self) -> _Slot:
        handle = self._remote.remote(self.parts, self.config, self._shipped, *self._batched)
        number, self._started = self._started, self._started + 1
        if self._setup is not None:
            self._setup(handle, number)
        return _Slot(handle, handle.ready.remote(), number=number)

    def _check_resources(self) -> None:
        if not self._owned:
            return  # a cluster may grow (autoscaling): wait for the actors instead
        have = self._ray.cluster_resources()
        for name, per in (("CPU", self.resources.cpus), ("GPU", self.resources.gpus)):
            if per > 0 and have.get(name, 0) < per:
                flag = "actor_cpus" if name == "CPU" else "actor_gpus"
                raise ConfigError(
                    flag, f"each actor needs {per:g} {name}(s); this machine's Ray has {have.get(name, 0):g}"
                )

    def _wait_ready(self, timeout_s: float, expect: dict | None) -> None:
        ray = self._ray
        pending = {slot.ready: slot for slot in self.slots}
        deadline = time.monotonic() + timeout_s
        while pending:
            self._poll_stop()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=min(0.5, max(deadline - time.monotonic(), 0)))
            if not done and time.monotonic() >= deadline:
                raise ConfigError("actors", f"{len(pending)} of {len(self.slots)} actors did not start within {timeout_s:g} s: "
                                  f"the cluster lacks {self.resources.cpus:g} CPU(s) / {self.resources.gpus:g} GPU(s) per actor")  # fmt: skip
            for ref in done:
                slot = pending.pop(ref)
                try:
                    slot.info = ray.get(ref)
                except ray.exceptions.RayError as err:
                    if not lost_to_cluster(ray, err):
                        raise _start_error(err) from err
                    self.slots[self.slots.index(slot)] = replace(slot, handle=None, ready=None)  # the run goes on
                    self.dropped += 1
                    lost_while_starting(ray, err, sum(s.live for s in self.slots))
                    continue
                slot.ready = None
                self.nodes.add(slot.info["node"])
                if expect is not None:
                    _same_parts(slot.info, expect)

    # -- running ---------------------------------------------------------
    def episodes(
        self, todo: Iterable[int | tuple[int, int]], subscribers: Sequence[Subscriber] = (), max_tries: int = MAX_TRIES
    ) -> Iterator[EpisodeEnd]:
        """Run episodes ``todo`` (an index, its seed derived from the pool's config, or ``(index, seed)``) on the actors; see :meth:`run`."""
        return self.run(episode_specs(todo, self.config), subscribers, max_tries)

    def run(
        self, specs: Iterable[EpisodeSpec], subscribers: Sequence[Subscriber] = (), max_tries: int = MAX_TRIES
    ) -> Iterator[EpisodeEnd]:
        """Run ``specs`` on the actors; yield each finished episode (``record`` attached) after ``emit``-ting it to ``subscribers``.

        Episodes finish in any order. A try that fails (its actor died, or
        ``run`` raised on it) runs again on a live or new actor; after
        ``max_tries`` the episode goes to :attr:`failed`. With ``envs`` > 1 a
        call runs a list of episodes (:func:`stream_batches`).
        """
        if self.envs > 1:  # a call runs several episodes; each comes back as it ends
            records = (r for _, r in stream_batches(self, specs, max_tries))
        else:
            call = lambda handle, ep: handle.run.remote(ep.index, ep.seed, ep.config)  # noqa: E731
            records = (r for _, r in self.map(call, specs, lambda ep: ep.index, max_tries))
        for record in records:
            yield emit(record, subscribers)

    def summary(self) -> dict:
        """What a run's summary adds for actors."""
        return {
            "actors": len(self.slots),
            "envs": self.envs,
            "envs_per_actor": self.envs,  # the old name of "envs", kept for what reads it
            "address": self.address or "local (127.0.0.1)",
            "nodes": len(self.nodes),
            "retries": self.retries,
            "actors_replaced": self.replaced,
            "actors_dropped": self.dropped,
            "failed": {str(i): why for i, why in sorted(self.failed.items())},
            "ray_start_s": getattr(self, "ray_start_s", float("nan")),
            "actors_start_s": getattr(self, "start_s", float("nan")),
        }

    # ------------------------------------------------ the one scheduling loop every Ray source runs on
    def map(
        self, call, items: Iterable, key=lambda item: item, max_tries: int = MAX_TRIES
    ) -> Iterator[tuple[object, object]]:
        """Run ``call(actor_handle, item)`` (it returns a Ray ref) for every item; yield ``(item, result)`` as each finishes.

        One item per call, on :meth:`schedule` (one call per ready actor at a time, retries, replacements, drops).
        """
        units = ((item,) for item in items)
        return self.schedule(units, lambda handle, unit: call(handle, unit[0]), key, max_tries)

    def schedule(
        self,
        units: Iterable[tuple],
        start,
        key=lambda item: item,
        max_tries: int = MAX_TRIES,
        streaming: bool = False,
        split=None,
    ) -> Iterator[tuple[object, object]]:
        """The one scheduling loop of every Ray source: run each unit (a tuple of items) as one call; yield ``(item, answer)``.

        ``start(actor_handle, unit)`` returns a Ray ref whose value is the unit's one item's answer, or with
        ``streaming`` a streaming generator that yields ``(key(item), answer)`` for each item of the unit as it
        ends (:func:`~rollcap.rollout.ray.actors.stream_batches`). One call per actor at a time, and only on an actor whose
        ``ready()`` has answered. A call that fails (its actor or node died, or the method raised) sends the
        items it had not answered back to the front of the queue for any live actor (``split``: as these units;
        default one unit); a dead actor is replaced, and a replacement that is not ready within
        :attr:`replace_timeout_s` is dropped (one line on stderr). An item in ``max_tries`` failed calls goes
        to :attr:`failed` (by ``key``) with the one-line reason; with no live actor left, so do the items not
        yet run. The next unit is submitted before an answer is yielded, so actors stay busy while the caller
        handles it.
        """
        ray = self._ray
        todo = deque(units)
        tries: dict = {}
        idle = [n for n, s in enumerate(self.slots) if s.live and s.ready is None]
        busy: dict = {}  # a call's ref or generator -> (slot, {key: item} not answered yet)

        def submit() -> None:
            while todo and idle:
                slot, unit = idle.pop(0), todo.popleft()
                busy[start(self.slots[slot].handle, unit)] = (slot, {key(item): item for item in unit})

        def lost(slot: int, left: dict, err: BaseException) -> None:
            if isinstance(err, ray.exceptions.RayActorError):  # the actor process (or its node) died
                # one line naming the node and what runs again (a batched call: every episode it had not answered)
                again = [k for k in left if tries.get(k, 0) + 1 < max_tries]
                say_lost(
                    ray,
                    self.slots[slot].info.get("node"),
                    err,
                    what_runs_again(again, [k for k in left if k not in again]),
                )
                self._replace(slot)
            else:
                idle.append(slot)
            again = self._tried_again(left, err, tries, max_tries)
            if again:
                self.retries += 1
                todo.extendleft(reversed(split(tuple(again)) if split else [tuple(again)]))

        while todo or busy:
            submit()
            starting = {s.ready: n for n, s in enumerate(self.slots) if s.live and s.ready is not None}
            if not busy and not idle and not starting:
                self._no_actors_left([key(item) for unit in todo for item in unit])
                return
            done, _ = ray.wait([*busy, *starting], num_returns=1, timeout=0.5)
            idle += self._poll_starting(starting)
            for ref in done:
                if ref not in busy:
                    continue  # a ready() call: handled by _poll_starting
                slot, left = busy[ref]
                try:
                    k, answer = ray.get(next(ref)) if streaming else (next(iter(left)), ray.get(ref))
                except StopIteration:  # a streaming call is over
                    del busy[ref]
                    if left:  # it ended without answering for these (it should not)
                        lost(slot, left, RuntimeError(f"the actor's call ended without items {sorted(left)}"))
                    else:
                        idle.append(slot)
                    continue
                except ray.exceptions.RayError as err:
                    del busy[ref]
                    lost(slot, left, err)
                    continue
                item = left.pop(k)
                if not streaming:  # its one answer: the call is over
                    del busy[ref]
                    idle.append(slot)
                submit()
                yield item, answer

    def _replace(self, slot: int) -> None:
        """Replace a dead actor (its Ray handle is unusable) with a new one; it gets work once its ``ready()`` answers."""
        self._kill(self.slots[slot].handle)
        self.slots[slot] = self._new_slot()
        self.replaced += 1

    def _poll_starting(self, starting: dict) -> list[int]:
        """The slots among ``starting`` (``ready`` ref -> slot) whose actor is now ready; drop those that failed or timed out."""
        ready = []
        done, _ = self._ray.wait(list(starting), num_returns=len(starting), timeout=0) if starting else ([], [])
        for ref in done:
            slot = self.slots[starting[ref]]
            try:
                slot.info = self._ray.get(ref)
            except self._ray.exceptions.RayError as err:
                self._drop(starting[ref], f"a replacement actor could not start ({_one_line(err)})")
                continue
            slot.ready = None
            self.nodes.add(slot.info["node"])
            ready.append(starting[ref])
        now = time.monotonic()
        for ref, n in starting.items():
            if ref not in done and now - self.slots[n].since > self.replace_timeout_s:
                self._drop(n, f"a replacement actor was not ready within {self.replace_timeout_s:g} s "
                              f"(no node has {self.resources.cpus:g} CPU(s) / {self.resources.gpus:g} GPU(s) free for it)")  # fmt: skip
        return ready

    def _drop(self, slot: int, why: str) -> None:
        self._kill(self.slots[slot].handle)  # a pending one is cancelled: no demand left behind
        self.slots[slot] = replace(self.slots[slot], handle=None, ready=None)
        self.dropped += 1
        live = sum(s.live for s in self.slots)
        print(f"rollcap: {why}; going on with {live} actor(s)", file=sys.stderr)

    def _no_actors_left(self, keys: list) -> None:
        why = f"no live actor left ({self.dropped} dropped)"
        for k in keys:
            self.failed[k] = why
        print(f"rollcap: {why}: {len(keys)} item(s) not run", file=sys.stderr)

    def _kill(self, handle) -> None:
        try:
            self._ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass

    def _tried_again(self, left: dict, err: BaseException, tries: dict, max_tries: int) -> list:
        """A failed call's unanswered items (``{key: item}``), each a try more: those out of tries go to
        :attr:`failed` with ``err``'s one line; the others are returned, to run again."""
        again = []
        for k, item in left.items():
            tries[k] = tries.get(k, 0) + 1
            if tries[k] >= max_tries:
                self.failed[k] = _one_line(err)
            else:
                again.append(item)
        return again

    def close(self) -> None:
        """Stop the actors (an episode running on one is lost) and a Ray instance this pool started (idempotent)."""
        ray, self._ray = self._ray, None
        if ray is None or not ray.is_initialized():
            return
        for slot in self.slots:
            if slot.live:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:  # noqa: BLE001 - best effort: shutting down anyway
                    pass
        if self._owned:
            ray.shutdown()

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _portable(parts: Parts) -> tuple[Parts, tuple[str, ...]]:
    """``parts`` for actors that may run elsewhere: checkpoint paths and a ``lerobot:DIR`` made absolute; the shipped
    checkpoints named (each node has its own copy). ``expert[:STD]`` is no path and stays as it is."""
    shipped = tuple(
        k for k, path in _SHIPPED.items() if getattr(parts, k) is not None and Path(getattr(parts, k)) == path
    )
    paths = [
        k
        for k in _SHIPPED
        if getattr(parts, k) is not None and k not in shipped and not (k == "policy" and named_policy(parts.policy))
    ]
    portable = {k: Path(getattr(parts, k)).resolve() for k in paths}
    named = named_policy(parts.policy)
    if named is not None and named[0] == "lerobot":
        portable["policy"] = Path(LEROBOT_PREFIX + str(Path(named[1]).resolve()))
    return replace(parts, **portable), shipped


def _start_error(err: BaseException) -> Exception:
    """A ConfigError for an actor that could not build its parts (the actor's own ConfigError, when it raised one)."""
    cause, seen = err, set()
    while isinstance(cause, BaseException) and not isinstance(cause, ConfigError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__  # a RayTaskError's .cause is the actor's exception
    if isinstance(cause, ConfigError):
        return ConfigError(cause.field, f"on a Ray actor: {cause.problem}")
    return ConfigError("actors", f"a rollout actor could not start: {_one_line(err)}")


# --------------------------------------------------------- the plain call
@dataclass
class BatchResult:
    """What :func:`batch_rollout` returns."""

    ends: list[EpisodeEnd]
    """Finished episodes in the order they finished (``record`` attached unless ``keep_records=False``)."""
    summary: dict
    """Actors, nodes, retries, failed episodes, start-up times (:meth:`ActorPool.summary`)."""


def batch_rollout(  # noqa: PLR0913 - the plain call's documented options
    specs: Iterable[EpisodeSpec],
    num_actors: int,
    address: str | None = None,
    *,
    parts: Parts | None = None,
    resources: ActorResources = ActorResources(),
    subscribers: Sequence[Subscriber] = (),
    max_tries: int = MAX_TRIES,
    keep_records: bool = True,
    actor_cls: type | None = None,
    envs: int = 1,
    graphs: int = 1,
) -> BatchResult:
    """Run episode ``specs`` on ``num_actors`` Ray actors built from ``parts``; the finished episodes come back here.

    To record them, pass a recorder as a subscriber (``rollcap.run(actors=N)``
    does that, with a background writer, progress and ``summary.json``).

    Args:
        address: the cluster to join (``"auto"``, ``host:port``, ``ray://host:port``);
            None starts a local Ray on 127.0.0.1 only (and shuts it down after),
            unless this process is connected to Ray already.
        max_tries: tries per episode (see :meth:`ActorPool.run`).
        keep_records: False drops each record once the subscribers had it.
        actor_cls: :class:`RolloutActor` (None: the default) or a subclass.
        envs, graphs: each actor drives ``envs`` envs on ``graphs`` graphs (see :class:`ActorPool`).

    Raises:
        ConfigError: as :class:`ActorPool`.
    """
    specs = list(specs)
    if not specs:
        return BatchResult([], {})
    with ActorPool(
        parts or Parts(), specs[0].config, num_actors, address, resources, actor_cls=actor_cls, envs=envs, graphs=graphs
    ) as pool:
        ends = [
            e
            if keep_records
            else EpisodeEnd(e.index, e.seed, e.stop_reason, e.success, e.num_steps, e.num_chunks, e.error)
            for e in pool.run(specs, subscribers, max_tries)
        ]
        return BatchResult(ends, pool.summary())


# ---------------------------------------------------- the driver's side of actors that drive N envs each
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
