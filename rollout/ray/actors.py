"""Ray batch rollouts: episodes run on actors, the driver records them.

- :class:`RolloutActor` is a plain class: it builds one env, its runners and
  a :class:`~rollcap.rollout.host.RolloutHost` from :class:`Parts` and a
  :class:`HostConfig`, and runs one episode per call. :class:`ActorPool` makes
  it an actor at the call site; tests also use it without Ray.
- Actors only compute. Each finished episode comes back to the driver and goes
  to the subscribers a local run has, the ``InBackground(EpisodeRecorder)``
  writer first: one writer per HDF5 file (HDF5 has no concurrent writers), the
  same rollback journal and atomic npz writes, so ``--resume`` verifies the run
  directory as for a local run. Episodes reach the recorder in the order they
  finish; it accepts any index order.
- Determinism: an episode's recorded bytes depend on its spec and the runners'
  fingerprint only; each actor runs one episode at a time, unbatched, so which
  actor ran it and how many there were change only the timings (not digested).
- Faults: an actor process that dies mid-episode is replaced and its episode
  runs again (``retries``); an episode that fails ``max_tries`` times is
  reported in ``failed``, not recorded (``--resume`` runs it again). Ctrl-C
  stops the actors; finished episodes are kept (:func:`rollcap.rollout.api.run`).
- Local by default, on 127.0.0.1 only: :func:`~rollcap.rollout.ray.connect.connect`.

``ray`` is imported lazily (``pip install 'rollcap[ray]'``). Imports point
downward: this module knows ``build``, ``config``, ``host``, ``protocols``,
``seeding``, ``episode``, ``policies``, ``critics`` and ``ray_connect``; the entry
points (``api``, ``ray_replay``, ``branch``, the CLI, the benches) import it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.rollout.build import Parts, make_env, make_runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, EpisodeStart, Subscriber, observation_at
from rollcap.rollout.ray.connect import EXTRA, connect, import_ray  # noqa: F401 - EXTRA and connect are part of this module's API
from rollcap.rollout.seeding import episode_seed

MAX_TRIES = 3
"""Tries per episode before it is reported failed (each try that kills its actor costs one)."""
_SHIPPED = {"policy": DEFAULT_POLICY, "critic": DEFAULT_CRITIC}


def check_actor_run(env, policy, critic) -> None:
    """Refuse, before anything is built, a run on actors given objects (actors build their own parts), or without Ray.

    Raises:
        ConfigError: naming ``actors``.
    """
    def named(x) -> bool:
        return x is None or isinstance(x, (str, os.PathLike))

    if not (isinstance(env, str) and named(policy) and named(critic)):
        raise ConfigError("actors", "actors build their own env, policy and critic: pass an env id and checkpoint paths, not objects")
    try:
        import_ray()
    except ImportError as err:
        raise ConfigError("actors", str(err)) from err


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: its index, its seed and the config it runs with."""

    index: int
    seed: int
    config: HostConfig


def episode_specs(indices: Iterable[int], config: HostConfig) -> list[EpisodeSpec]:
    """The specs of episodes ``indices`` of a run with ``config`` (seeds derived as in a local run)."""
    return [EpisodeSpec(int(i), episode_seed(config.seed, int(i)), config) for i in indices]


@dataclass(frozen=True)
class ActorResources:
    """What Ray reserves for each actor."""

    cpus: float = 1.0
    gpus: float = 0.0


# ----------------------------------------------------------------- the actor
class RolloutActor:
    """One env, its runners and one host per config; runs one episode per :meth:`run` call.

    A plain class (``ray.remote(RolloutActor)`` makes it an actor). Single-threaded:
    Ray runs one method of an actor at a time.
    """

    def __init__(self, parts: Parts, config: HostConfig, shipped: tuple[str, ...] = ()):
        """Build the parts (``shipped``: "policy" / "critic" use this machine's copy of the shipped checkpoint)."""
        parts = replace(parts, **{k: _SHIPPED[k] for k in shipped})
        self.env = make_env(parts.env_id, parts.env_kwargs)
        self.policy, self.critic = make_runners(parts, self.env, rtc=config.chunking != "sync")  # real-time chunking needs the carrying runner
        self._hosts: dict[HostConfig, RolloutHost] = {}
        self.host(config)

    def host(self, config: HostConfig) -> RolloutHost:
        """The host for ``config`` (built on first use, on the same env and runners)."""
        if config not in self._hosts:
            self._hosts[config] = RolloutHost(self.env, self.policy, self.critic, config)
        return self._hosts[config]

    def ready(self) -> dict:
        """Who this actor is: pid, Ray node (if any), and :func:`identity` of its first host."""
        host = next(iter(self._hosts.values()))
        ray = sys.modules.get("ray")  # None: used without Ray
        node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
        return {"pid": os.getpid(), "node": node, **identity(host)}

    def run(self, index: int, seed: int, config: HostConfig | None = None) -> EpisodeRecord:
        """Run episode ``index`` with ``seed`` (and ``config``; default: the first one) and return its record."""
        host = self.host(config) if config is not None else next(iter(self._hosts.values()))
        return host.run_episode(index, seed).record

    def close(self) -> None:
        for part in (self.policy, self.critic, self.env):
            if part is not None:
                part.close()


# ------------------------------------------------------ records to events
def emit(record: EpisodeRecord, subscribers: Sequence[Subscriber]) -> EpisodeEnd:
    """Hand an episode finished elsewhere to ``subscribers``: its start, chunks and end, replayed from ``record``.

    ``on_step`` is not called (the steps ran on the actor). Returns the end (``record`` attached).
    """
    chunks, n = record.chunks, record.num_chunks
    shape = tuple(chunks["noise"].shape[1:]) if n else (0, 0)
    start = EpisodeStart(record.index, record.seed, record.instruction, observation_at(record, 0), record.initial_state, record.env_id, record.env_kwargs, record.config, record.fingerprints, shape)
    for s in subscribers:
        s.on_episode_start(start)
    for k in range(n):
        step = int(chunks["chunk_start"][k])
        stopped_here = k == n - 1 and step == record.num_steps and record.stop_reason not in ("error", "caller")
        event = ChunkEvent(
            record.index, k, step, observation_at(record, step), chunks["noise"][k], chunks["policy_chunk"][k], float(chunks["critic_value"][k]),
            float(chunks["latency_policy_s"][k]), float(chunks["latency_critic_s"][k]), float(chunks["latency_boundary_s"][k]),
            record.stop_reason if stopped_here else None,
        )  # fmt: skip
        for s in subscribers:
            s.on_chunk(event)
    end = EpisodeEnd(record.index, record.seed, record.stop_reason, record.success, record.num_steps, n, error=record.error, record=record)
    for s in subscribers:
        s.on_episode_end(end)
    return end


@dataclass
class _Slot:
    handle: object
    ready: object = None
    """The ``ready()`` call of a new actor, until it answers."""
    info: dict = field(default_factory=dict)


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
        actor_cls: :class:`RolloutActor` or a subclass.

    Raises:
        ConfigError: an actor could not start (naming the field when the
            actor's error names one), or actors ran other weights than
            ``expect`` (a checkpoint path naming another file on a node).
    """

    def __init__(
        self,
        parts: Parts,
        config: HostConfig,
        num_actors: int,
        address: str | None = None,
        resources: ActorResources = ActorResources(),
        expect: dict | None = None,
        start_timeout_s: float = 300.0,
        actor_cls: type = RolloutActor,
    ):
        if num_actors < 1:
            raise ConfigError("actors", f"expected an integer >= 1, got {num_actors!r}")
        self.config, self.resources = config, resources
        self.parts, self._shipped = _portable(parts)
        self.address, self.retries, self.replaced = address, 0, 0
        self.failed: dict[int, str] = {}
        self.slots: list[_Slot] = []
        self.nodes: set = set()
        self._ray = None
        self._owned = False
        t0 = time.perf_counter()
        try:
            self._ray = import_ray()
            local_cpus = max(os.cpu_count() or 1, math.ceil(num_actors * resources.cpus)) if address is None else None
            self._owned = connect(address, local_cpus)
            self.ray_start_s = time.perf_counter() - t0
            self._check_resources()
            self._remote = self._ray.remote(actor_cls).options(num_cpus=resources.cpus, num_gpus=resources.gpus, max_restarts=0)
            self.slots = [self._new_slot() for _ in range(num_actors)]
            self._wait_ready(start_timeout_s, expect)
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0

    @classmethod
    def for_run(cls, parts: Parts, host: RolloutHost, cfg) -> ActorPool:
        """The pool a :class:`~rollcap.rollout.api.RunConfig` asks for, checked against the driver's ``host``."""
        gpus = cfg.actor_gpus if cfg.actor_gpus is not None else (0.0 if parts.device.startswith("cpu") else 1.0 / cfg.actors)
        return cls(parts, host.config, cfg.actors, cfg.address, ActorResources(cfg.actor_cpus, gpus), identity(host))

    # -- start-up --------------------------------------------------------
    def _new_slot(self) -> _Slot:
        handle = self._remote.remote(self.parts, self.config, self._shipped)
        return _Slot(handle, handle.ready.remote())

    def _check_resources(self) -> None:
        if not self._owned:
            return  # a cluster may grow (autoscaling): wait for the actors instead
        have = self._ray.cluster_resources()
        for name, per in (("CPU", self.resources.cpus), ("GPU", self.resources.gpus)):
            if per > 0 and have.get(name, 0) < per:
                flag = "actor_cpus" if name == "CPU" else "actor_gpus"
                raise ConfigError(flag, f"each actor needs {per:g} {name}(s); this machine's Ray has {have.get(name, 0):g}")

    def _wait_ready(self, timeout_s: float, expect: dict | None) -> None:
        ray = self._ray
        pending = {slot.ready: slot for slot in self.slots}
        deadline = time.monotonic() + timeout_s
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=min(0.5, max(deadline - time.monotonic(), 0)))
            if not done and time.monotonic() >= deadline:
                raise ConfigError("actors", f"{len(pending)} of {len(self.slots)} actors did not start within {timeout_s:g} s: "
                                  f"the cluster lacks {self.resources.cpus:g} CPU(s) / {self.resources.gpus:g} GPU(s) per actor")  # fmt: skip
            for ref in done:
                slot = pending.pop(ref)
                try:
                    slot.info = ray.get(ref)
                except ray.exceptions.RayError as err:
                    raise _start_error(err) from err
                slot.ready = None
                self.nodes.add(slot.info["node"])
                if expect is not None:
                    _same_parts(slot.info, expect)

    # -- running ---------------------------------------------------------
    def episodes(self, indices: Iterable[int], subscribers: Sequence[Subscriber] = (), max_tries: int = MAX_TRIES) -> Iterator[EpisodeEnd]:
        """Run episodes ``indices`` (specs from the pool's config) on the actors; see :meth:`run`."""
        return self.run(episode_specs(indices, self.config), subscribers, max_tries)

    def run(self, specs: Iterable[EpisodeSpec], subscribers: Sequence[Subscriber] = (), max_tries: int = MAX_TRIES) -> Iterator[EpisodeEnd]:
        """Run ``specs`` on the actors; yield each finished episode (``record`` attached) after ``emit``-ting it to ``subscribers``.

        Episodes finish in any order. A try that fails (its actor died, or
        ``run`` raised on it) runs again on a live or new actor; after
        ``max_tries`` the episode goes to :attr:`failed`.
        """
        call = lambda handle, spec: handle.run.remote(spec.index, spec.seed, spec.config)  # noqa: E731
        for _, record in self.map(call, specs, lambda spec: spec.index, max_tries):
            yield emit(record, subscribers)

    def map(self, call, items: Iterable, key=lambda item: item, max_tries: int = MAX_TRIES) -> Iterator[tuple[object, object]]:
        """Run ``call(actor_handle, item)`` (it returns a Ray ref) for every item; yield ``(item, result)`` as each finishes.

        One call per actor at a time. A call that fails (its actor died, or the
        method raised) runs again on a live or new actor; after ``max_tries``
        the item's ``key`` goes to :attr:`failed` with the one-line reason.
        The next item is submitted before a result is yielded, so actors stay
        busy while the caller handles it.
        """
        ray = self._ray
        todo = deque(items)
        tries: dict = {}
        idle = list(range(len(self.slots)))
        busy: dict[object, tuple[int, object]] = {}

        def submit() -> None:
            while todo and idle:
                slot, item = idle.pop(0), todo.popleft()
                busy[call(self.slots[slot].handle, item)] = (slot, item)

        while todo or busy:
            submit()
            self._note_ready()
            done, _ = ray.wait(list(busy), num_returns=1, timeout=0.5)
            for ref in done:
                slot, item = busy.pop(ref)
                idle.append(slot)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as err:
                    if isinstance(err, ray.exceptions.RayActorError):  # the actor process died
                        self._replace(slot)
                    k = key(item)
                    tries[k] = tries.get(k, 0) + 1
                    if tries[k] >= max_tries:
                        self.failed[k] = _one_line(err)
                    else:
                        self.retries += 1
                        todo.appendleft(item)
                    continue
                submit()
                yield item, result

    def _replace(self, slot: int) -> None:
        """Replace a dead actor (its Ray handle is unusable) with a new one; its run calls queue until it is built."""
        try:
            self._ray.kill(self.slots[slot].handle, no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        self.slots[slot] = self._new_slot()
        self.replaced += 1

    def _note_ready(self) -> None:
        for slot in self.slots:
            if slot.ready is not None:
                done, _ = self._ray.wait([slot.ready], timeout=0)
                if done:
                    try:
                        slot.info = self._ray.get(slot.ready)
                        self.nodes.add(slot.info["node"])
                    except self._ray.exceptions.RayError:
                        pass  # its run calls fail too, and are counted there
                    slot.ready = None

    def summary(self) -> dict:
        """What a run's summary adds for actors."""
        return {
            "actors": len(self.slots),
            "address": self.address or "local (127.0.0.1)",
            "nodes": len(self.nodes),
            "retries": self.retries,
            "actors_replaced": self.replaced,
            "failed": {str(i): why for i, why in sorted(self.failed.items())},
            "ray_start_s": getattr(self, "ray_start_s", float("nan")),
            "actors_start_s": getattr(self, "start_s", float("nan")),
        }

    def close(self) -> None:
        """Stop the actors (an episode running on one is lost) and a Ray instance this pool started (idempotent)."""
        ray, self._ray = self._ray, None
        if ray is None or not ray.is_initialized():
            return
        for slot in self.slots:
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
    """``parts`` for actors that may run elsewhere: checkpoint paths made absolute; the shipped checkpoints named (each node has its own copy)."""
    shipped = tuple(k for k, path in _SHIPPED.items() if getattr(parts, k) is not None and Path(getattr(parts, k)) == path)
    return replace(parts, **{k: Path(getattr(parts, k)).resolve() for k in _SHIPPED if getattr(parts, k) is not None and k not in shipped}), shipped


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


def _start_error(err: BaseException) -> Exception:
    """A ConfigError for an actor that could not build its parts (the actor's own ConfigError, when it raised one)."""
    cause, seen = err, set()
    while isinstance(cause, BaseException) and not isinstance(cause, ConfigError) and id(cause) not in seen:
        seen.add(id(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__  # a RayTaskError's .cause is the actor's exception
    if isinstance(cause, ConfigError):
        return ConfigError(cause.field, f"on a Ray actor: {cause.problem}")
    return ConfigError("actors", f"a rollout actor could not start: {_one_line(err)}")


def identity(host: RolloutHost) -> dict:
    """What must agree between the driver and every actor: the resolved config and the weights digests."""
    weights = {}
    for part in ("policy", "critic"):
        comp = getattr(host, part)
        weights[part] = None if comp is None else comp.state_fingerprint().get("weights_digest")
    return {"config": host.config, "weights": weights}


def _same_parts(info: dict, expect: dict) -> None:
    """Refuse actors whose resolved config or weights differ from the driver's."""
    if info["config"] != expect["config"]:
        raise ConfigError("actors", f"an actor resolved the config to {info['config']}, this process to {expect['config']}")
    for part in ("policy", "critic"):
        got, want = info["weights"][part], expect["weights"][part]
        if got != want:
            raise ConfigError(part, f"an actor loaded {part} weights {got or 'none'}, this process {want or 'none'}: "
                              "a checkpoint path must name the same file on every node")  # fmt: skip


# --------------------------------------------------------- the plain call
@dataclass
class BatchResult:
    """What :func:`batch_rollout` returns."""

    ends: list[EpisodeEnd]
    """Finished episodes in the order they finished (``record`` attached unless ``keep_records=False``)."""
    summary: dict
    """Actors, nodes, retries, failed episodes, start-up times (:meth:`ActorPool.summary`)."""


def batch_rollout(
    specs: Iterable[EpisodeSpec],
    num_actors: int,
    address: str | None = None,
    *,
    parts: Parts = Parts(),
    resources: ActorResources = ActorResources(),
    subscribers: Sequence[Subscriber] = (),
    max_tries: int = MAX_TRIES,
    keep_records: bool = True,
    actor_cls: type = RolloutActor,
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
        actor_cls: :class:`RolloutActor` or a subclass.

    Raises:
        ConfigError: as :class:`ActorPool`.
    """
    specs = list(specs)
    if not specs:
        return BatchResult([], {})
    with ActorPool(parts, specs[0].config, num_actors, address, resources, actor_cls=actor_cls) as pool:
        ends = [e if keep_records else EpisodeEnd(e.index, e.seed, e.stop_reason, e.success, e.num_steps, e.num_chunks, e.error) for e in pool.run(specs, subscribers, max_tries)]
        return BatchResult(ends, pool.summary())
