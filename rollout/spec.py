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
(a :class:`ConfigError` naming the field). A spec holds words and typed
values: the env, the policy and the critic are each a name (an env id, a
checkpoint path, ``lerobot:DIR``, ``expert[:STD]``, ``none``) or an object of
yours (an env, a :class:`~rollcap.rollout.protocols.ChunkPolicy`, a
:class:`~rollcap.rollout.protocols.ChunkCritic`), told apart by one rule,
:func:`is_name`. Nothing is probed when a spec is made (a GPU, a compiler, a
LeRobot directory, the cores for ``env_workers="auto"``):
:func:`rollcap.rollout.build.build` does that (:func:`~rollcap.rollout.build.probe`,
:func:`~rollcap.rollout.build.for_this_machine`).

``envs`` is the env count everywhere (this spec, ``--envs``, the summary, the
build function's argument); gymnasium's ``num_envs`` is kept only where
gymnasium asks for it (``gym.make_vec``).

Importing it imports no torch (the command line's parser and an env worker
read these dataclasses); checking a deployment's device imports it
(:func:`check_graph_settings`). ``tests/rollout/cli/test_startup.py`` guards this.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rollcap.critics.shipped import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.critics.shipped import MT10_CHECKPOINT as MT10_CRITIC
from rollcap.policies.shipped import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies.shipped import MT10_CHECKPOINT as MT10_POLICY
from rollcap.rollout.config import BYTES, MAX_ENVS, HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.protocols import ChunkCritic, ChunkPolicy, Env

if TYPE_CHECKING:
    import torch

__all__ = ["Parts", "RunConfig", "Spec", "byte_fields", "is_name", "DEFAULT_ENV", "FORMATS"]

DEFAULT_ENV = "rollcap/PushBlock-v0"
FORMATS = ("npz", "h5")
LEROBOT_PREFIX, EXPERT = "lerobot:", "expert"
DEVICE_TYPES = ("cpu", "cuda")


# ------------------------------------------------------------- deployment
def is_name(x) -> bool:
    """The one rule for a spec's env, policy and critic: a name (an id, a checkpoint path, ``lerobot:DIR``,
    ``expert[:STD]``, ``none``) is a ``str`` or a path; anything else is an object of yours, used as it is."""
    return isinstance(x, (str, os.PathLike))


@dataclass(frozen=True)
class Parts:
    """The env and the models: where they come from, where they run.

    ``env_id``, ``policy`` and ``critic`` hold names (the flags') or, from Python, objects of yours: an env, a
    :class:`~rollcap.rollout.protocols.ChunkPolicy`, a :class:`~rollcap.rollout.protocols.ChunkCritic`
    (:func:`is_name` tells them apart).
    """

    env_id: str | Env = field(default=DEFAULT_ENV, metadata={**BYTES, "flag": "--env"})
    """Gymnasium env id (rollcap's own envs are registered on import)."""
    env_kwargs: dict | None = field(default=None, metadata=BYTES)
    """Keyword arguments for gym.make, e.g. {"image_size": 64}."""
    policy: Path | ChunkPolicy = field(default=DEFAULT_POLICY, metadata=BYTES)
    """Policy checkpoint (.json or .safetensors), lerobot:DIR or expert[:STD]; default: the shipped one for the env.

    Policy checkpoint (.json or .safetensors; default: the shipped one for the env, the MT10 policy on a MetaWorld MT10 task); lerobot:DIR, a LeRobot policy's save_pretrained directory (in LeRobot's venv: bash scripts/lerobot_env.sh); expert[:STD], the env's scripted expert (the built-in task's, or a MetaWorld task's from metaworld.policies; STD: Gaussian action noise from the host's noise)."""
    critic: Path | ChunkCritic | None = field(default=DEFAULT_CRITIC, metadata=BYTES)
    """Critic checkpoint, or 'none' to run without one; default: the shipped one for the env.

    Critic checkpoint (default: the shipped one for the env, the MT10 critic on a MetaWorld MT10 task, none on another MetaWorld task, which no shipped critic reads); 'none' runs without a critic."""
    device: str = field(default="cpu", metadata=BYTES)
    """cpu or cuda[:i]."""
    backend: Literal["eager", "jit", "aoti", "compile", "cuda", "compile-cuda"] | None = field(
        default=None, metadata=BYTES
    )
    """Graph backend; default: jit on CPU, cuda on GPU (lerobot:DIR: eager).

    Graph backend (default: jit on CPU, cuda on GPU; lerobot:DIR: eager, and it takes jit on CPU, cuda on GPU); aoti and compile are CPU plans built with a C++ compiler (cached under ~/.cache/rollcap); compile-cuda: inductor's kernels in rollcap's CUDA graph (GPU only)."""
    threads: int = 1
    """Intra-op threads per lane (the policy and the critic each get one lane)."""
    precision: Literal["fp32", "tf32", "bf16", "fp8"] = field(default="fp32", metadata=BYTES)
    """Numeric precision of the policy and critic graphs (tf32 and fp8: CUDA only); in the fingerprint.

    Numeric precision of the policy and critic graphs: fp32; tf32 (CUDA tensor cores); bf16 (autocast, CUDA or CPU); fp8 (bf16, and the policy's action-expert GEMMs in float8 e4m3 with per-channel weight scales; CUDA compute capability 8.9+, refused elsewhere). Recorded in the fingerprint; replay takes it back."""
    sampler: Literal["plain", "fused", "lean", "sde"] = field(default="plain", metadata=BYTES)
    """The FlowVLA policy's sampler: plain, fused or lean (fewer kernels, not byte-equal to plain), sde (flow RL).

    The FlowVLA policy's sampler: plain; fused (norms folded, QKV fused, flow-time inputs precomputed: fewer kernels; within 6e-7 of plain on the shipped checkpoints, not byte-equal; its fingerprint says "variant": "fused"; replay takes it back); lean (fused, and fewer bytes between GEMMs: residual adds fused into the norms, bias+GELU in the GEMM epilogue, bf16 weights stored once; byte-equal to fused on CPU, within a stated bound on CUDA; "variant": "lean"); sde (Flow-SDE: Gaussian noise at every Euler step, drawn on the host from the chunk's noise and recorded, so each chunk has an exact log-probability, recorded beside it: flow RL's sampler, rollcap.policies.flow_sde). The critic stays plain."""
    noise_level: float = field(default=0.5, metadata=BYTES)
    """With sampler sde: the SDE's noise level a (each step's scale is a sqrt(t / (1 - t)); in the fingerprint)."""

    def __post_init__(self):
        if is_name(self.critic) and str(self.critic).lower() == "none":
            object.__setattr__(self, "critic", None)
        if is_name(self.env_id):  # the built-in task's defaults stand for "the shipped one for the env"
            policy, critic = shipped_models(self.env_id)
            if is_name(self.policy) and named_policy(self.policy) is None and Path(self.policy) == DEFAULT_POLICY:
                object.__setattr__(self, "policy", policy)
            if is_name(self.critic) and Path(self.critic) == DEFAULT_CRITIC:
                object.__setattr__(self, "critic", critic)
        if is_name(self.policy):
            _check_policy_name(self)
        else:  # a policy object runs as it is: a setting of rollcap's own graphs would be ignored
            for name, plain in (("sampler", "plain"), ("precision", "fp32")):
                if getattr(self, name) != plain:
                    raise ConfigError(
                        name, f"{getattr(self, name)!r} applies to rollcap's checkpoints; a policy object runs as it is"
                    )
        if self.sampler not in ("plain", "fused", "lean", "sde"):
            raise ConfigError("sampler", f"expected plain, fused, lean or sde, got {self.sampler!r}")
        if self.sampler == "sde":
            from rollcap.policies.flow_sde import check_noise_level  # torch: only an sde run's spec needs it

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

    @property
    def names_only(self) -> bool:
        """The env, the policy and the critic are all names (what actors, env workers and a batch build from)."""
        return is_name(self.env_id) and is_name(self.policy) and (self.critic is None or is_name(self.critic))


def check_graph_settings(backend: str | None, precision: str, device: str) -> torch.device:
    """The rules of device, precision and backend together, written once; returns the device.

    Precision against the backend's plan is the graph's own mechanism check
    (:func:`rollcap.kernels.precision.check_plan_precision`, one message), here as a ConfigError. Nothing is
    probed (a GPU present, a compiler on PATH): :func:`rollcap.rollout.build.probe` does that at build.

    Raises:
        ConfigError: naming ``device``, ``precision`` or ``backend``.
    """
    import torch  # a deployment's device is torch's to parse (a spec without one imports no torch)

    from rollcap.kernels.graph import check_cpu_plan
    from rollcap.kernels.precision import check_plan_precision, check_precision

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


def shipped_models(env_id: str) -> tuple[Path, Path | None]:
    """The shipped policy and critic for ``env_id``: the MT10 pair on a MetaWorld MT10 task; on another MetaWorld task
    no critic (no shipped critic reads its observations, so ``--policy expert`` runs there as it is) and the built-in
    task's policy (which refuses the task, naming ``--policy expert``); else the built-in task's pair."""
    from rollcap.envs.metaworld import ID_PREFIX, MT10  # (rollcap.envs imports MuJoCo: not for building the parser)

    if env_id.startswith(ID_PREFIX):
        return (MT10_POLICY, MT10_CRITIC) if env_id.removeprefix(ID_PREFIX) in MT10 else (DEFAULT_POLICY, None)
    return DEFAULT_POLICY, DEFAULT_CRITIC


def named_policy(policy) -> tuple[str, str] | None:
    """``("lerobot", DIR)`` or ``("expert", "expert[:STD]")`` for a policy named so, None for a checkpoint path (or
    a policy object)."""
    if not is_name(policy):
        return None
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
    """Refuse a malformed ``expert:`` name before anything is built (ConfigError naming ``policy``); a ``lerobot:DIR``
    is checked where it is built (:func:`rollcap.rollout.build.probe`: its directory, lerobot importable)."""
    named = named_policy(parts.policy)
    if named is not None and named[0] == "expert":
        expert_std(named[1])


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
    """Run the episodes on this many Ray actors (0: in this process); needs pip install 'rollcap[ray]'.

    Run the episodes on this many Ray actors (0: in this process, without Ray; with envs N, each actor drives N envs on one graph); needs pip install 'rollcap[ray]'."""
    address: str | None = None
    """With actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray).

    With actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only); a head with token auth takes the token from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    actor_cpus: float = 1.0
    """With actors: CPUs reserved per actor."""
    actor_gpus: float | None = None
    """With actors: GPU share per actor, e.g. 0.5 (default: 0 on cpu; with a cuda device 1/actors, all on one GPU)."""
    shards: bool = True
    """With actors: each actor records its own shard of the run (false: the actors' episodes are recorded here).

    With actors: each actor records its own shard of the run dir and this process writes only manifest.jsonl (every command reads it as one run; rollcap merge RUN makes one file); false: actors send episodes here to be recorded."""
    shard_dir: Path | None = None
    """With actors and shards, on a cluster without a shared filesystem: each node's shard directory.

    With actors and shards, for a cluster without a shared filesystem: each actor writes its shard to PATH/<run name>/sNNN on its own node (a PATH every node has); the manifest names each shard's path and node; copy them back, then rollcap merge RUN [--from DIR]."""
    teleop: str | None = None
    """A person in the loop: keys from keyboard, terminal or scripted:FILE.

    A person in the loop: keys from keyboard (X, else the terminal), terminal or scripted:FILE; a live view; the reset waits for the go key."""
    require_exact: bool = False
    """Refuse an env whose episodes cannot replay byte for byte, instead of warning.

    Refuse an env whose episodes cannot replay byte for byte (not repeatable, or no exact state) instead of warning and recording anyway."""
    envs: int = field(default=1, metadata=BYTES)
    """Envs stepped in lockstep by one policy and one critic graph at this batch (with actors: each actor's).

    Envs stepped in lockstep by one policy graph and one critic graph captured at this batch (each env its own episodes; the batch is in the fingerprint, so an episode replays at its batch); with actors: the envs of each actor, which runs several episodes per call (the same bytes as in this process)."""
    graphs: int = field(default=1, metadata=BYTES)
    """With envs: split them over this many policy and critic graphs, each at batch envs/graphs.

    With envs: split them over this many policy and critic graphs, each at batch envs/graphs on its own lanes (on CPU, one per core runs the batches side by side)."""
    writers: int = 0
    """Recording processes: 0 writes on a thread of this process, N >= 1 in N child processes (a shard each).

    Recording processes: 0 writes on a thread of this process; N >= 1 in N child processes, each a shard of the run (read as one run; rollcap merge RUN makes one file), for more episodes a second than one thread keeps up with (a GPU box: about 2 per 100 episodes/s)."""
    env_workers: int | Literal["auto"] = "auto"
    """With envs N: step them in this many worker processes, a shard each (0: here; auto: by this machine's cores).

    With envs N: step the N envs in this many worker processes (each records its episodes in its own shard of the run) while this process runs only the batched graphs; for a machine whose cores idle while one process steps every env (a GPU box: about one per core). 0: every env in this process (your subscribers then see observations). auto (the default): one a core this process may use, less two, at most N (a multiple of graphs), and 0 where that is under 2 (a machine under 4 cores), with envs 1, or with actors, writers or teleop. The same bytes either way."""

    def __post_init__(self):
        self._check_counts()
        self._check_placement()
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

    def _check_counts(self) -> None:
        """Episodes, envs, graphs, writers, env workers and actors: each in range, and the ones that exclude another."""
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
        other = self.no_env_workers_with
        w = self.env_workers  # "auto" is settled where the machine is known (rollcap.rollout.build.for_this_machine)
        if w != "auto" and (not _is_int(w) or w < 0 or (w and (self.envs < 2 or w > self.envs))):
            raise ConfigError(
                "env_workers", f"expected an integer in 0..envs (envs >= 2; here {self.envs}) or auto, got {w!r}"
            )
        if w and w != "auto" and other:
            raise ConfigError("env_workers", f"each env worker records its own shard in this run; drop `{other}`")
        if self.envs > 1 and self.teleop is not None:
            raise ConfigError("envs", f"a batched run (envs={self.envs}) runs without a person; drop `teleop`")
        if not _is_int(self.actors) or self.actors < 0:
            raise ConfigError("actors", f"expected an integer >= 0, got {self.actors!r}")

    def _check_placement(self) -> None:
        """Teleop, a cluster's address and the actors' resources: each valid, and only where it can apply."""
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

    @property
    def no_env_workers_with(self) -> str | None:
        """The setting env workers cannot run with (each records its own shard; a person drives one env), or None."""
        return "actors" if self.actors else "writers" if self.writers else "teleop" if self.teleop else None


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
        if self.deployment.sampler == "sde" and self.run.env_workers not in (0, "auto"):
            raise ConfigError(
                "sampler", "sde records each chunk's log-probabilities beside it; run it without env workers"
            )

    @property
    def no_env_workers_with(self) -> str | None:
        """The setting env workers cannot run with: the run's (:attr:`RunConfig.no_env_workers_with`), or the sde
        sampler (each chunk's log-probabilities are recorded beside it, in the policy's process); None if none."""
        return self.run.no_env_workers_with or ("sampler" if self.deployment.sampler == "sde" else None)

    @classmethod
    def of(cls, episodes: int = 10, out=None, env=DEFAULT_ENV, policy=None, critic=None, **options) -> Spec:
        """The spec ``rollcap.run(episodes=..., out=..., env=..., policy=..., critic=..., **options)`` describes.

        ``env`` / ``policy`` / ``critic``: a name, or an object (an env, a ChunkPolicy, a ChunkCritic) the
        deployment holds as it is (:func:`is_name`); a policy object has no shipped critic (``critic`` None: none).

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
        parts_kw = {**pick["deployment"], "env_id": env}
        if policy is not None:
            parts_kw["policy"] = Path(policy) if is_name(policy) else policy
        if critic is not None:
            parts_kw["critic"] = Path(critic) if is_name(critic) else critic
        elif policy is not None and not is_name(policy):  # a policy of yours: no shipped critic
            parts_kw["critic"] = None
        host = HostConfig(**pick["host"])
        run = RunConfig(episodes=episodes, out=out, **pick["run"])
        return cls(Parts(**parts_kw), host, run)


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
