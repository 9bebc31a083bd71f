"""The spec of a run: one nested, frozen description every entry point takes or produces.

```
Spec
  deployment  Parts      the env, the models, where and how they run (env_id, env_kwargs, policy, critic,
                         device, backend, threads, precision, sampler)
  host        HostConfig when episodes stop and how they are seeded (rollcap.rollout.config)
  run         RunConfig  how many episodes, where they are recorded, how they are run (episodes, out,
                         formats, resume, envs, graphs, actors, writers, env_workers, ...)
```

Each field's rules sit beside it: its default, its docstring (the CLI's help:
:mod:`rollcap.rollout.options` derives one flag per field), its flag when
it is not ``--field-name`` (``field(metadata={"flag": ...})``), whether an
episode's bytes depend on it (``metadata={"bytes": True}``: it is in the
recorded config or the runners' fingerprint; :func:`byte_fields` lists them for
resume and replay), and its validation in its section's ``__post_init__``
(a :class:`ConfigError` naming the field). A spec is only words: nothing is
probed when one is made (is there a GPU, a compiler): :func:`rollcap.rollout.build.probe`
does that when something is built.

``envs`` is the env count everywhere (this spec, ``--envs``, the summary, the
build function's argument); gymnasium's ``num_envs`` is kept only where
gymnasium asks for it (``gym.make_vec``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.critics import MT10_CHECKPOINT as MT10_CRITIC
from rollcap.envs.metaworld import ID_PREFIX, MT10
from rollcap.kernels.graph import check_cpu_plan
from rollcap.kernels.precision import check_plan_precision, check_precision
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies import MT10_CHECKPOINT as MT10_POLICY
from rollcap.policies.flow_sde import check_noise_level
from rollcap.rollout.config import BYTES, HostConfig
from rollcap.rollout.errors import ConfigError


__all__ = ["Parts", "HostConfig", "RunConfig", "Spec", "byte_fields", "DEFAULT_ENV", "FORMATS", "MAX_ENVS"]

DEFAULT_ENV = "rollcap/PushBlock-v0"
FORMATS = ("npz", "h5")
MAX_ENVS = 1024
"""The largest batch ``envs`` accepts."""
LEROBOT_PREFIX, EXPERT = "lerobot:", "expert"
DEVICE_TYPES = ("cpu", "cuda")


# ------------------------------------------------------------- deployment
@dataclass(frozen=True)
class Parts:
    """The env and the models: where they come from, where they run."""

    env_id: str = field(default=DEFAULT_ENV, metadata={**BYTES, "flag": "--env"})
    """Gymnasium env id (rollcap's own envs are registered on import)."""
    env_kwargs: dict | None = field(default=None, metadata=BYTES)
    """Keyword arguments for gym.make, e.g. {"image_size": 64}."""
    policy: Path = field(default=DEFAULT_POLICY, metadata=BYTES)
    """Policy checkpoint (.json or .safetensors; default: the shipped one for the env, the MT10 policy on a MetaWorld MT10 task); lerobot:DIR, a LeRobot policy's save_pretrained directory (in LeRobot's venv: bash scripts/lerobot_env.sh); expert[:STD], the env's scripted expert (the built-in task's, or a MetaWorld task's from metaworld.policies; STD: Gaussian action noise from the host's noise)."""
    critic: Path | None = field(default=DEFAULT_CRITIC, metadata=BYTES)
    """Critic checkpoint (default: the shipped one for the env, the MT10 critic on a MetaWorld MT10 task); 'none' runs without a critic."""
    device: str = field(default="cpu", metadata=BYTES)
    """cpu or cuda[:i]."""
    backend: Literal["eager", "jit", "aoti", "compile", "cuda", "compile-cuda"] | None = field(
        default=None, metadata=BYTES
    )
    """Graph backend (default: jit on CPU, cuda on GPU; lerobot:DIR: eager, and it takes jit on CPU, cuda on GPU); aoti and compile are CPU plans built with a C++ compiler (cached under ~/.cache/rollcap); compile-cuda: inductor's kernels in rollcap's CUDA graph (GPU only)."""
    threads: int = 1
    """Intra-op threads per lane (the policy and the critic each get one lane)."""
    precision: Literal["fp32", "tf32", "bf16", "fp8"] = field(default="fp32", metadata=BYTES)
    """Numeric precision of the policy and critic graphs: fp32; tf32 (CUDA tensor cores); bf16 (autocast, CUDA or CPU); fp8 (bf16, and the policy's action-expert GEMMs in float8 e4m3 with per-channel weight scales; CUDA compute capability 8.9+, refused elsewhere). Recorded in the fingerprint; replay takes it back."""
    sampler: Literal["plain", "fused", "lean", "sde"] = field(default="plain", metadata=BYTES)
    """The FlowVLA policy's sampler: plain; fused (norms folded, QKV fused, flow-time inputs precomputed: fewer kernels; within 6e-7 of plain on the shipped checkpoints, not byte-equal; its fingerprint says "variant": "fused"; replay takes it back); lean (fused, and fewer bytes between GEMMs: residual adds fused into the norms, bias+GELU in the GEMM epilogue, bf16 weights stored once; byte-equal to fused on CPU, within a stated bound on CUDA; "variant": "lean"); sde (Flow-SDE: Gaussian noise at every Euler step, drawn on the host from the chunk's noise and recorded, so each chunk has an exact log-probability, recorded beside it: flow RL's sampler, rollcap.policies.flow_sde). The critic stays plain."""
    noise_level: float = field(default=0.5, metadata=BYTES)
    """With sampler sde: the SDE's noise level a (each step's scale is a sqrt(t / (1 - t)); in the fingerprint)."""

    def __post_init__(self):
        if self.critic is not None and str(self.critic).lower() == "none":
            object.__setattr__(self, "critic", None)
        policy, critic = shipped_models(
            self.env_id
        )  # the built-in task's defaults stand for "the shipped one for the env"
        if named_policy(self.policy) is None and Path(self.policy) == DEFAULT_POLICY:
            object.__setattr__(self, "policy", policy)
        if self.critic is not None and Path(self.critic) == DEFAULT_CRITIC:
            object.__setattr__(self, "critic", critic)
        _check_policy_name(self)
        if self.sampler not in ("plain", "fused", "lean", "sde"):
            raise ConfigError("sampler", f"expected plain, fused, lean or sde, got {self.sampler!r}")
        try:
            check_noise_level(self.noise_level)
        except ValueError as err:
            raise ConfigError("noise_level", str(err).partition(": ")[2]) from None
        if self.sampler != "plain" and named_policy(self.policy) is not None:
            raise ConfigError(
                "sampler",
                f"{self.sampler} is a FlowVLA checkpoint's sampler; {self.policy} has no {self.sampler} variant (run it with the plain sampler)",
            )
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ConfigError("threads", f"expected an integer >= 1, got {self.threads!r}")
        lerobot = (named := named_policy(self.policy)) is not None and named[0] == "lerobot"
        # a LeRobot policy's backends are its own ('eager' or the device's capture): build names them (named.py)
        check_graph_settings(None if lerobot else self.backend, self.precision, self.device)
        if self.precision != "fp32" and lerobot:
            raise ConfigError(
                "precision",
                f"{self.precision}: a LeRobot policy runs at its own dtype (fp32 here); the setting applies to rollcap's graphs",
            )


def check_graph_settings(backend: str | None, precision: str, device: str) -> torch.device:
    """The rules of device, precision and backend together, written once; returns the device.

    Precision against the backend's plan is the graph's own mechanism check
    (:func:`rollcap.kernels.precision.check_plan_precision`, one message), here as a ConfigError. Nothing is
    probed (a GPU present, a compiler on PATH): :func:`rollcap.rollout.build.probe` does that at build.

    Raises:
        ConfigError: naming ``device``, ``precision`` or ``backend``.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError("device", f"expected cpu or cuda[:i], got {device!r}") from err
    if dev.type not in DEVICE_TYPES:
        raise ConfigError("device", f"expected cpu or cuda[:i], got {device!r}")
    try:
        if not (precision == "fp8" and dev.type == "cuda"):  # a GPU's float8 cores are probed at build
            check_precision(precision, dev)
        check_plan_precision(precision, backend)
    except ValueError as err:
        raise ConfigError("precision", str(err)) from None
    if backend in ("cuda", "compile-cuda") and dev.type != "cuda":
        raise ConfigError(
            "backend",
            f"{backend!r} captures a CUDA graph; use it with `device=cuda`, not {device} (on the CPU: jit, eager, aoti or compile)",
        )
    if backend in ("aoti", "compile"):
        try:
            check_cpu_plan(backend, device)
        except ValueError as err:
            raise ConfigError("backend", str(err)) from None
    return dev


def shipped_models(env_id: str) -> tuple[Path, Path]:
    """The shipped policy and critic for ``env_id``: the MT10 pair on a MetaWorld MT10 task, else the built-in task's."""
    if env_id.startswith(ID_PREFIX) and env_id.removeprefix(ID_PREFIX) in MT10:
        return MT10_POLICY, MT10_CRITIC
    return DEFAULT_POLICY, DEFAULT_CRITIC


def named_policy(policy) -> tuple[str, str] | None:
    """``("lerobot", DIR)`` or ``("expert", "expert[:STD]")`` for a policy named so, None for a checkpoint path."""
    text = str(policy)
    if text.startswith(LEROBOT_PREFIX):
        return "lerobot", text[len(LEROBOT_PREFIX) :]
    if re.fullmatch(rf"{EXPERT}(:.*)?", text):
        return "expert", text
    return None


def expert_std(name: str) -> float:
    """``expert`` -> 0.0, ``expert:0.1`` -> 0.1; a ConfigError naming ``policy`` otherwise."""
    text = name.removeprefix(EXPERT).removeprefix(":") or "0"
    try:
        std = float(text)
    except ValueError:
        std = -1.0
    if not (0.0 <= std <= 1.0):
        raise ConfigError("policy", f"{name}: expected expert or expert:STD with 0 <= STD <= 1")
    return std


def _check_policy_name(parts: Parts) -> None:
    """Refuse a malformed ``lerobot:`` / ``expert:`` name before anything is built (ConfigError naming ``policy``);
    a LeRobot directory is made absolute (actors may run in another directory)."""
    named = named_policy(parts.policy)
    if named is None:
        return
    kind, arg = named
    if kind == "expert":
        expert_std(arg)
        return
    directory = Path(arg)
    if not (directory / "config.json").is_file():
        raise ConfigError(
            "policy",
            f"{LEROBOT_PREFIX}{arg}: {directory} holds no config.json; expected a LeRobot policy's save_pretrained directory (lerobot-train's checkpoints/last/pretrained_model)",
        )
    if importlib.util.find_spec("lerobot") is None:
        raise ConfigError(
            "policy",
            f"{LEROBOT_PREFIX}{arg}: lerobot is not importable in this Python ({sys.version.split()[0]}); build LeRobot's venv with `bash scripts/lerobot_env.sh` and run rollcap from it",
        )
    object.__setattr__(parts, "policy", Path(LEROBOT_PREFIX + str(directory.resolve())))


# -------------------------------------------------------------------- run
@dataclass(frozen=True)
class RunConfig:
    """How many episodes, and where and how they are recorded."""

    episodes: int = 10
    """Episodes in the run (with resume: the run's total, finished ones included)."""
    out: Path | None = None
    """Run directory (default: runs/<timestamp>, with runs/latest pointing at it)."""
    formats: tuple[str, ...] = field(default=FORMATS, metadata={"flag": "--format"})
    """Recording formats, a comma list of npz,h5."""
    resume: bool = False
    """Continue an interrupted run in out: run the episodes it lacks."""
    progress: bool = True
    """Show a progress bar."""
    actors: int = 0
    """Run the episodes on this many Ray actors (0: in this process, without Ray; with envs N, each actor drives N envs on one graph); needs pip install 'rollcap[ray]'."""
    address: str | None = None
    """With actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only); a head with token auth takes the token from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    actor_cpus: float = 1.0
    """With actors: CPUs reserved per actor."""
    actor_gpus: float | None = None
    """With actors: GPU share per actor, e.g. 0.5 (default: 0 on cpu; with a cuda device 1/actors, all on one GPU)."""
    shards: bool = True
    """With actors: each actor records its own shard of the run dir and this process writes only manifest.jsonl (every command reads it as one run; rollcap merge RUN makes one file); false: actors send episodes here to be recorded."""
    shard_dir: Path | None = None
    """With actors and shards, for a cluster without a shared filesystem: each actor writes its shard to PATH/<run name>/sNNN on its own node (a PATH every node has); the manifest names each shard's path and node; copy them back, then rollcap merge RUN [--from DIR]."""
    teleop: str | None = None
    """A person in the loop: keys from keyboard (X, else the terminal), terminal or scripted:FILE; a live view; the reset waits for the go key."""
    require_exact: bool = False
    """Refuse an env whose episodes cannot replay byte for byte (not repeatable, or no exact state) instead of warning and recording anyway."""
    envs: int = field(default=1, metadata=BYTES)
    """Envs stepped in lockstep by one policy graph and one critic graph captured at this batch (each env its own episodes; the batch is in the fingerprint, so an episode replays at its batch); with actors: the envs of each actor, which runs several episodes per call (the same bytes as in this process)."""
    graphs: int = field(default=1, metadata=BYTES)
    """With envs: split them over this many policy and critic graphs, each at batch envs/graphs on its own lanes (on CPU, one per core runs the batches side by side)."""
    writers: int = 0
    """Recording processes: 0 writes on a thread of this process; N >= 1 in N child processes, each a shard of the run (read as one run; rollcap merge RUN makes one file), for more episodes a second than one thread keeps up with (a GPU box: about 2 per 100 episodes/s)."""
    env_workers: int | Literal["auto"] = 0
    """With envs N: step the N envs in this many worker processes (each records its episodes in its own shard of the run) while this process runs only the batched graphs; for a machine whose cores idle while one process steps every env (a GPU box: about one per core). 0: every env in this process. auto: one a core this process may use, less two, at most N (a multiple of graphs), and 0 where that is under 2 or with actors, writers or teleop. The same bytes either way."""

    def __post_init__(self):
        if not _is_int(self.episodes) or self.episodes < 1:
            raise ConfigError("episodes", f"expected an integer >= 1, got {self.episodes!r}")
        if not _is_int(self.envs) or not 1 <= self.envs <= MAX_ENVS:
            raise ConfigError("envs", f"expected an integer in 1..{MAX_ENVS}, got {self.envs!r}")
        if not _is_int(self.graphs) or self.graphs < 1 or self.envs % self.graphs:
            raise ConfigError(
                "graphs", f"expected an integer >= 1 that divides envs ({self.envs}), got {self.graphs!r}"
            )
        if not _is_int(self.writers) or not 0 <= self.writers <= 64:
            raise ConfigError("writers", f"expected an integer in 0..64, got {self.writers!r}")
        if self.writers and self.actors:
            raise ConfigError("writers", "with actors each actor records its own shard already; drop `writers`")
        other = "actors" if self.actors else "writers" if self.writers else "teleop" if self.teleop else None
        if self.env_workers == "auto":
            object.__setattr__(self, "env_workers", 0 if other else auto_env_workers(self.envs, self.graphs))
        w = self.env_workers
        if not isinstance(w, int) or isinstance(w, bool) or w < 0 or (w and (self.envs < 2 or w > self.envs)):
            raise ConfigError(
                "env_workers", f"expected an integer in 0..envs (envs >= 2; here {self.envs}) or auto, got {w!r}"
            )
        if w and other:
            raise ConfigError("env_workers", f"each env worker records its own shard in this run; drop `{other}`")
        if self.envs > 1 and self.teleop is not None:
            raise ConfigError("envs", f"a batched run (envs={self.envs}) runs without a person; drop `teleop`")
        if not _is_int(self.actors) or self.actors < 0:
            raise ConfigError("actors", f"expected an integer >= 0, got {self.actors!r}")
        if self.teleop is not None and self.actors:
            raise ConfigError("teleop", "a person drives one episode at a time in this process; drop `actors`")
        if self.teleop is not None and not (
            self.teleop in ("keyboard", "terminal") or self.teleop.startswith("scripted:")
        ):
            raise ConfigError("teleop", f"expected keyboard, terminal or scripted:FILE, got {self.teleop!r}")
        if self.address is not None and not self.actors:
            raise ConfigError("address", f"joining a Ray cluster ({self.address}) needs actors (`actors=N`, N >= 1)")
        if not (_is_number(self.actor_cpus) and 0 < self.actor_cpus < float("inf")):
            raise ConfigError("actor_cpus", f"expected a finite number > 0, got {self.actor_cpus!r}")
        if self.actor_gpus is not None and not (_is_number(self.actor_gpus) and 0 <= self.actor_gpus < float("inf")):
            raise ConfigError("actor_gpus", f"expected a finite number >= 0, got {self.actor_gpus!r}")
        formats = (self.formats,) if isinstance(self.formats, str) else tuple(self.formats)
        if not formats or set(formats) - set(FORMATS) or len(set(formats)) != len(formats):
            raise ConfigError(
                "formats",
                f"expected a list of {','.join(FORMATS)} without repeats, got {','.join(map(str, formats)) or 'nothing'}",
            )
        object.__setattr__(self, "formats", formats)
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        if self.shard_dir is not None and not (self.actors and self.shards):
            raise ConfigError(
                "shard_dir",
                "per-node shard directories are for runs on actors that record shards (`actors=N`, not `shards=False`)",
            )


def check_batched_host(config: HostConfig) -> None:
    """The host's rules at batch N > 1: synchronous chunking, no control period (ConfigError naming the field)."""
    if config.chunking != "sync":
        raise ConfigError("chunking", f"a batched run (envs > 1) chunks synchronously, got {config.chunking!r}")
    if config.control_period_s is not None:
        raise ConfigError(
            "control_period_s", "a batched run (envs > 1) steps its envs in lockstep, unpaced; drop the control period"
        )


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_env_workers(envs: int, graphs: int = 1, cores: int | None = None) -> int:
    """``env_workers="auto"``: one worker a core, leaving two (this process's graphs and the rest of the machine), at
    most ``envs`` and a multiple of ``graphs`` (each graph's envs on workers of their own); 0 (every env in this
    process) where that leaves fewer than 2 workers: on a small machine workers take cores from the policy
    (BENCHMARKS.md, "Env workers"). ``cores``: default the cores this process may run on."""
    w = min(envs, (usable_cores() if cores is None else cores) - 2)
    if graphs > 1:
        w -= w % graphs
    return w if w >= 2 else 0


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ------------------------------------------------------------------- spec
SECTIONS = (("deployment", Parts), ("host", HostConfig), ("run", RunConfig))
"""The spec's sections and the dataclass of each; every field name is unique across them."""
OPTION_NAMES = frozenset(f.name for _, cls in SECTIONS for f in dataclasses.fields(cls) if f.init)


@dataclass(frozen=True)
class Spec:
    """A whole run: its deployment, its host's rules and how it is run (see the module docstring)."""

    deployment: Parts = field(default_factory=Parts)
    host: HostConfig = field(default_factory=HostConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self):
        if self.deployment.sampler == "sde" and self.host.chunking != "sync":
            raise ConfigError(
                "sampler", "sde samples whole chunks; real-time chunking (chunking naive / rtc) needs plain"
            )
        if self.deployment.sampler == "sde" and self.run.env_workers:
            raise ConfigError(
                "sampler", "sde records each chunk's log-probabilities beside it; run it without env workers"
            )

    @classmethod
    def of(cls, episodes: int = 10, out=None, env=DEFAULT_ENV, policy=None, critic=None, **options) -> Spec:
        """The spec ``rollcap.run(episodes, out=..., env=..., policy=..., critic=..., **options)`` describes.

        ``env`` / ``policy`` / ``critic`` may be objects (an env, a ChunkPolicy, a ChunkCritic): the
        deployment then names what it can (a policy object runs as it is: a setting of rollcap's own
        graphs is refused; a critic object or a policy of your own has no shipped critic).

        Raises:
            TypeError: an option no section has.
            ConfigError: a bad value, naming its field.
        """
        names = {name: {f.name for f in dataclasses.fields(c) if f.init} for name, c in SECTIONS}
        unknown = sorted(set(options) - OPTION_NAMES - {"env_id", "policy", "critic"})
        if unknown or {"env_id", "episodes", "out"} & set(options):
            bad = unknown or sorted({"env_id", "episodes", "out"} & set(options))
            raise TypeError(
                f"run(): unexpected option(s) {bad}; options are the fields of HostConfig, RunConfig and Parts"
            )
        pick = {name: {k: v for k, v in options.items() if k in fields} for name, fields in names.items()}
        parts_kw = pick["deployment"]
        if isinstance(env, str):
            parts_kw["env_id"] = env
        if isinstance(policy, (str, os.PathLike)):
            parts_kw["policy"] = Path(policy)
        elif policy is not None:  # a policy object runs as it is: a setting of rollcap's own graphs would be ignored
            for name, plain in (("sampler", "plain"), ("precision", "fp32")):
                if parts_kw.get(name, plain) != plain:
                    raise ConfigError(
                        name, f"{parts_kw[name]!r} applies to rollcap's checkpoints; a policy object runs as it is"
                    )
        if isinstance(critic, (str, os.PathLike)):
            parts_kw["critic"] = Path(critic)
        elif critic is not None or not is_path(policy):  # a critic object, or a user's policy: no shipped critic
            parts_kw["critic"] = None
        host = HostConfig(**pick["host"])
        run = RunConfig(episodes=episodes, out=out, **pick["run"])
        return cls(Parts(**parts_kw), host, run)

    def options(self) -> dict:
        """What :meth:`of` (``rollcap.run``) takes back besides ``episodes``, ``out`` and ``env``: every other field by name (no critic: ``"none"``)."""
        flat = {}
        for name, _ in SECTIONS:
            section = getattr(self, name)
            flat.update({f.name: getattr(section, f.name) for f in dataclasses.fields(section) if f.init})
        flat["critic"] = flat["critic"] or "none"
        return {k: v for k, v in flat.items() if k not in ("episodes", "out", "env_id")}


def is_path(x) -> bool:
    """A checkpoint named by a path (or by nothing: the default), not a model object."""
    return x is None or isinstance(x, (str, os.PathLike))


def byte_fields() -> tuple[tuple[str, str], ...]:
    """``(field, section)`` of every setting an episode's bytes depend on: the recorded config and the runners' fingerprint.

    Resume refuses to change any of them on a run that has episodes; replay and branch take each from the recording.
    """
    return tuple(
        (f.name, name) for name, cls in SECTIONS for f in dataclasses.fields(cls) if f.metadata.get("bytes", False)
    )


def flag_of(name: str) -> str:
    """The command-line flag of a spec field (``env_id`` -> ``--env``, ``max_chunks`` -> ``--max-chunks``)."""
    for _, cls in SECTIONS:
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.metadata.get("flag", "--" + name.replace("_", "-"))
    raise KeyError(name)
