"""What runs on a Ray actor: :class:`RolloutActor`, the episode specs it takes, and :func:`emit`.

:class:`RolloutActor` is a plain class (``ray.remote`` makes it an actor at
the call site, in :class:`~rollcap.rollout.ray.actors.ActorPool`; tests use
it without Ray). It builds its envs and runners from :class:`Parts` at the
run's batch and runs the same round as this process would
(:func:`~rollcap.rollout.batch.round_here`): one episode a call, or a list of
them in its slots (``envs`` N; :func:`~rollcap.rollout.ray.actors.stream_batches` is the driver's
side). With a shard it records each episode itself
(:meth:`RolloutActor.record_to`) and returns a light record (no images) with a
receipt; otherwise it returns the whole record.
:func:`emit` hands an episode finished elsewhere to a local run's subscribers.

Imports point downward: this module knows ``batch``, ``build``, ``config``, ``host``,
``protocols``, ``seeding``, ``episode``, ``recording`` and ``ray.connect``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from rollcap.rollout.recording import EpisodeRecorder
from rollcap.rollout.recording.shards import MANIFEST
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.recording.codec import is_image

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.rollout.batch import Round, round_here
from rollcap.rollout.build import build
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import (
    ChunkEvent,
    EpisodeEnd,
    EpisodeStart,
    Subscriber,
    observation_at,
)
from rollcap.rollout.ray.connect import check_reachable, import_ray
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec

_SHIPPED = {"policy": DEFAULT_POLICY, "critic": DEFAULT_CRITIC}


def check_actor_run(parts: Parts, address: str | None = None) -> None:
    """Refuse, before anything is built, a run on actors given objects (actors build their own parts), without Ray,
    or joining an ``address`` where nothing answers (Ray itself would retry for minutes).

    Raises:
        ConfigError: naming ``actors`` or ``address``.
    """
    if not parts.names_only:
        raise ConfigError(
            "actors", "actors build their own env, policy and critic: pass an env id and checkpoint paths, not objects"
        )
    try:
        import_ray()
    except ImportError as err:
        raise ConfigError("actors", str(err)) from err
    if address is not None:
        check_reachable(address)


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: its index, its seed and the config it runs with."""

    index: int
    seed: int
    config: HostConfig


def episode_specs(todo: Iterable[int | tuple[int, int]], config: HostConfig) -> list[EpisodeSpec]:
    """The specs of episodes ``todo`` of a run with ``config``: an index (its seed derived as in a local run) or ``(index, seed)``."""
    return [
        EpisodeSpec(int(i[0]), int(i[1]), config)
        if isinstance(i, tuple)
        else EpisodeSpec(int(i), episode_seed(config.seed, int(i)), config)
        for i in todo
    ]


# ----------------------------------------------------------------- the actor
class RolloutActor:
    """The envs and runners of ``parts`` at batch ``envs`` (``graphs`` pairs of graphs at ``envs // graphs``), and one
    round (:mod:`rollcap.rollout.batch`) per config over them, as the same run makes in this process.

    A plain class (``ray.remote(RolloutActor)`` makes it an actor; tests use it without Ray). :meth:`run`
    runs one episode a call (one slot, the others idle), :meth:`stream` a list of them in the round's slots,
    a slot starting the next as soon as its episode ends. Single-threaded: Ray runs one method of an actor at a time.
    """

    def __init__(self, parts: Parts, config: HostConfig, shipped: tuple[str, ...] = (), envs: int = 1, graphs: int = 1):
        """Build the parts (``shipped``: "policy" / "critic" use this machine's copy of the shipped checkpoint)."""
        parts = replace(parts, **{k: _SHIPPED[k] for k in shipped})
        run = RunConfig(envs=envs, graphs=graphs, env_workers=0)  # the actor steps its envs itself
        self._built = build(Spec(parts, config, run), check_env=False)
        self.envs = envs
        self._rounds: dict[HostConfig, Round] = {}
        try:
            self.round(config)
        except BaseException:
            self.close()
            raise

    def round(self, config: HostConfig | None = None) -> Round:
        """The round for ``config`` (default: the first; made on first use, on the same envs and runners)."""
        if config is None:
            return next(iter(self._rounds.values()))
        if config not in self._rounds:
            b = self._built
            self._rounds[config] = round_here(b.envs, b.policies, b.critics, config)
        return self._rounds[config]

    @property
    def env(self):
        """The first slot's env (a branch puts a recorded boundary back in it)."""
        return self._built.env

    def host(self, config: HostConfig | None = None) -> RolloutHost:
        """The first slot's host for ``config``: what :meth:`ready` names, what a branch runs on."""
        return next(iter(self.round(config).slots.values()))

    def ready(self) -> dict:
        """Who this actor is: pid, Ray node (if any), and :func:`identity` of its first host."""
        info = {"pid": os.getpid(), "node": _node_id(), **identity(self.host())}
        if hasattr(self, "_sees_run"):
            info["sees_run"] = self._sees_run
        return info

    def episodes(self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None) -> Iterator[EpisodeEnd]:
        """Run ``(index, seed)`` specs in the round's slots; yield each end (record attached) as it finishes."""
        return self.round(config).episodes(iter([(int(i), int(s)) for i, s in specs]))

    def run_batch(self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None) -> list[EpisodeRecord]:
        """Run the episodes ``specs`` names; return their records in the order they ended."""
        return [end.record for end in self.episodes(specs, config)]

    def run(self, index: int, seed: int, config: HostConfig | None = None) -> EpisodeRecord:
        """Run episode ``index`` with ``seed`` (and ``config``; default: the first one) and return its record."""
        (record,) = self.run_batch([(index, seed)], config)
        return record

    def stream(
        self, specs: Sequence[tuple[int, int]], config: HostConfig | None = None, recorded: bool = False
    ) -> Iterator[tuple[int, object]]:
        """Run ``specs``; yield ``(index, record)`` as each ends; ``recorded``: write it to this actor's shard first and
        yield ``(index, (light record, receipt))`` (see :meth:`run_recorded`). Ray calls it with ``num_returns="streaming"``."""
        for end in self.episodes(specs, config):
            yield end.index, self.recorded(end.record) if recorded else end.record

    def record_to(self, shard_dir: str, shard: str, formats: tuple[str, ...], env_meta: dict) -> None:
        """From now on :meth:`run_recorded` writes into the shard at ``shard_dir`` (a new directory; ``shard``: its name in the manifest)."""
        if not Path(
            shard
        ).is_absolute():  # under the run directory (an absolute shard is a per-node directory: --shard-dir)
            self._sees_run = (
                Path(shard_dir).parents[1] / MANIFEST
            ).is_file()  # False: a node without the driver's filesystem
        self._shard = (shard, EpisodeRecorder(shard_dir, formats, env_meta))

    def run_recorded(self, index: int, seed: int, config: HostConfig | None = None) -> tuple[EpisodeRecord, dict]:
        """Run an episode as :meth:`run`, record it in this actor's shard (every format, or none), and return
        ``(its record without images, receipt)``; the receipt ``{"index", "digest", "shard", "node"}`` is what the manifest names."""
        return self.recorded(self.run(index, seed, config))

    def recorded(self, record: EpisodeRecord) -> tuple[EpisodeRecord, dict]:
        """Write ``record`` in this actor's shard; return ``(it without images, its receipt)``."""
        shard, recorder = self._shard
        recorder.write(record)
        receipt = {"index": record.index, "digest": episode_digest(record), "shard": shard, "node": _node_id()}
        images = {k for k, v in record.obs.items() if is_image(v)}
        light = replace(
            record,
            obs={k: v for k, v in record.obs.items() if k not in images},
            final_obs={k: v for k, v in record.final_obs.items() if k not in images},
        )
        return light, receipt

    def close(self) -> None:
        shard = getattr(self, "_shard", None)
        if shard is not None:
            shard[1].close()
        for r in self._rounds.values():
            r.close_pool()
        self._built.close()


def _one_line(err: BaseException) -> str:
    """An error as one line (its type and last line), for ``failed`` and stderr."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


def _node_id() -> str | None:
    """The Ray node this process runs on (None: used without Ray)."""
    ray = sys.modules.get("ray")
    return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None


# ------------------------------------------------------ records to events
def emit(record: EpisodeRecord, subscribers: Sequence[Subscriber]) -> EpisodeEnd:
    """Hand an episode finished elsewhere to ``subscribers``: its start, chunks and end, replayed from ``record``.

    ``on_step`` is not called (the steps ran on the actor). Returns the end (``record`` attached).
    """
    chunks, n = record.chunks, record.num_chunks
    shape = tuple(chunks["noise"].shape[1:]) if n else (0, 0)
    start = EpisodeStart(
        record.index,
        record.seed,
        record.instruction,
        observation_at(record, 0),
        record.initial_state,
        record.env_id,
        record.env_kwargs,
        record.config,
        record.fingerprints,
        shape,
    )
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
    end = EpisodeEnd(
        record.index,
        record.seed,
        record.stop_reason,
        record.success,
        record.num_steps,
        n,
        error=record.error,
        record=record,
    )
    for s in subscribers:
        s.on_episode_end(end)
    return end


def identity(host) -> dict:
    """What must agree between the driver and every actor: the resolved config and the weights digests of ``host``
    (a :class:`RolloutHost`, or a placement's :class:`~rollcap.rollout.placement.Identity`)."""
    weights = {}
    for part in ("policy", "critic"):
        comp = getattr(host, part)
        weights[part] = None if comp is None else comp.state_fingerprint().get("weights_digest")
    return {"config": host.config, "weights": weights}


def _same_parts(info: dict, expect: dict) -> None:
    """Refuse actors whose resolved config or weights differ from the driver's."""
    if info["config"] != expect["config"]:
        raise ConfigError(
            "actors", f"an actor resolved the config to {info['config']}, this process to {expect['config']}"
        )
    for part in ("policy", "critic"):
        got, want = info["weights"][part], expect["weights"][part]
        if got != want:
            raise ConfigError(part, f"an actor loaded {part} weights {got or 'none'}, this process {want or 'none'}: "
                              "a checkpoint path must name the same file on every node")  # fmt: skip
