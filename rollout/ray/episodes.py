"""What runs on a Ray actor: :class:`RolloutActor`, the episode specs it takes, and :func:`emit`.

:class:`RolloutActor` is a plain class (``ray.remote`` makes it an actor at
the call site, in :class:`~rollcap.rollout.ray.actors.ActorPool`; tests use
it without Ray). It builds one env, its runners and one host per config from
:class:`Parts`, and runs one episode per call. With a shard it records each
episode itself (:meth:`RolloutActor.record_to`) and returns a light record
(no images) with a receipt; otherwise it returns the whole record.
:func:`emit` hands an episode finished elsewhere to a local run's subscribers.

Imports point downward: this module knows ``build``, ``config``, ``host``,
``protocols``, ``seeding``, ``episode``, ``recording`` and ``ray.connect``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from rollcap.rollout.recording import EpisodeRecorder
from rollcap.rollout.recording.shards import MANIFEST
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.recording.codec import is_image

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
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
from rollcap.rollout.spec import Parts, Spec

_SHIPPED = {"policy": DEFAULT_POLICY, "critic": DEFAULT_CRITIC}


def check_actor_run(env, policy, critic, address: str | None = None) -> None:
    """Refuse, before anything is built, a run on actors given objects (actors build their own parts), without Ray,
    or joining an ``address`` where nothing answers (Ray itself would retry for minutes).

    Raises:
        ConfigError: naming ``actors`` or ``address``.
    """

    def named(x) -> bool:
        return x is None or isinstance(x, (str, os.PathLike))

    if not (isinstance(env, str) and named(policy) and named(critic)):
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
    """One env, its runners and one host per config; runs one episode per :meth:`run` call.

    A plain class (``ray.remote(RolloutActor)`` makes it an actor). Single-threaded:
    Ray runs one method of an actor at a time.
    """

    def __init__(self, parts: Parts, config: HostConfig, shipped: tuple[str, ...] = ()):
        """Build the parts (``shipped``: "policy" / "critic" use this machine's copy of the shipped checkpoint)."""
        parts = replace(parts, **{k: _SHIPPED[k] for k in shipped})
        built = build(Spec(parts, config), check_env=False)  # real-time chunking: the carrying runner
        self.env, self.policy, self.critic = built.env, built.policy, built.critic
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
        info = {"pid": os.getpid(), "node": _node_id(), **identity(host)}
        if hasattr(self, "_sees_run"):
            info["sees_run"] = self._sees_run
        return info

    def run(self, index: int, seed: int, config: HostConfig | None = None) -> EpisodeRecord:
        """Run episode ``index`` with ``seed`` (and ``config``; default: the first one) and return its record."""
        host = self.host(config) if config is not None else next(iter(self._hosts.values()))
        return host.run_episode(index, seed).record

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
        for part in (self.policy, self.critic, self.env):
            if part is not None:
                part.close()


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
        raise ConfigError(
            "actors", f"an actor resolved the config to {info['config']}, this process to {expect['config']}"
        )
    for part in ("policy", "critic"):
        got, want = info["weights"][part], expect["weights"][part]
        if got != want:
            raise ConfigError(part, f"an actor loaded {part} weights {got or 'none'}, this process {want or 'none'}: "
                              "a checkpoint path must name the same file on every node")  # fmt: skip
