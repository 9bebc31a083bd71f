"""Build the parts a run needs from names and paths (the API's, the CLI's and replay's wiring)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.critics import CriticRunner, load_critic
from rollcap.kernels.graph import default_backend
from rollcap.kernels.lanes import make_lane
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies import PolicyRunner, load_policy
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.rollout.errors import ConfigError

DEFAULT_ENV = "rollcap/PushBlock-v0"
OWN_PACKAGES = ("rollcap", "gymnasium")
"""Packages whose env ids a recording keeps plain: ``module:id`` naming one of them records ``id``."""


@dataclass(frozen=True)
class Parts:
    """The env and the models: where they come from, where they run."""

    env_id: str = DEFAULT_ENV
    """Gymnasium env id (rollcap's own envs are registered on import)."""
    env_kwargs: dict | None = None
    """Keyword arguments for gym.make, e.g. {"image_size": 64}."""
    policy: Path = DEFAULT_POLICY
    """Policy checkpoint (.json or .safetensors; default: the shipped one for the env, the MT10 policy on a MetaWorld MT10 task); lerobot:DIR, a LeRobot policy's save_pretrained directory (in LeRobot's venv: bash scripts/lerobot_env.sh); expert[:STD], the env's scripted expert (the built-in task's, or a MetaWorld task's from metaworld.policies; STD: Gaussian action noise from the host's noise)."""
    critic: Path | None = DEFAULT_CRITIC
    """Critic checkpoint (default: the shipped one for the env, the MT10 critic on a MetaWorld MT10 task); 'none' runs without a critic."""
    device: str = "cpu"
    """cpu or cuda[:i]."""
    backend: Literal["eager", "jit", "aoti", "compile", "cuda", "compile-cuda"] | None = None
    """Graph backend (default: jit on CPU, cuda on GPU; lerobot:DIR: eager, and it takes jit on CPU, cuda on GPU); aoti and compile are CPU plans built with a C++ compiler (cached under ~/.cache/rollcap); compile-cuda: inductor's kernels in rollcap's CUDA graph (GPU only)."""
    threads: int = 1
    """Intra-op threads per lane (the policy and the critic each get one lane)."""
    precision: Literal["fp32", "tf32", "bf16", "fp8"] = "fp32"
    """Numeric precision of the policy and critic graphs: fp32; tf32 (CUDA tensor cores); bf16 (autocast, CUDA or CPU); fp8 (bf16, and the policy's action-expert GEMMs in float8 e4m3 with per-channel weight scales; CUDA compute capability 8.9+, refused elsewhere). Recorded in the fingerprint; replay takes it back."""
    sampler: Literal["plain", "fused", "lean"] = "plain"
    """The FlowVLA policy's sampler: plain; fused (norms folded, QKV fused, flow-time inputs precomputed: fewer kernels; within 6e-7 of plain on the shipped checkpoints, not byte-equal; its fingerprint says "variant": "fused"; replay takes it back); lean (fused, and fewer bytes between GEMMs: residual adds fused into the norms, bias+GELU in the GEMM epilogue, bf16 weights stored once; byte-equal to fused on CPU, within a stated bound on CUDA; "variant": "lean"). The critic stays plain."""

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
        if self.sampler not in ("plain", "fused", "lean"):
            raise ConfigError("sampler", f"expected plain, fused or lean, got {self.sampler!r}")
        if self.sampler != "plain" and named_policy(self.policy) is not None:
            raise ConfigError(
                "sampler",
                f"{self.sampler} is a FlowVLA checkpoint's sampler; {self.policy} has no {self.sampler} variant (run it with the plain sampler)",
            )
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ConfigError("threads", f"expected an integer >= 1, got {self.threads!r}")
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as err:
            raise ConfigError("device", f"expected cpu or cuda[:i], got {self.device!r}") from err
        if dev.type not in ("cpu", "cuda"):
            raise ConfigError("device", f"expected cpu or cuda[:i], got {self.device!r}")
        from rollcap.kernels.precision import check_precision

        try:
            check_precision(self.precision, dev)
        except ValueError as err:
            raise ConfigError("precision", str(err)) from None
        if self.precision != "fp32" and self.backend in ("aoti", "compile"):
            raise ConfigError(
                "precision", f"{self.precision} runs on the eager, jit and cuda backends, not {self.backend!r}"
            )
        if self.backend in ("cuda", "compile-cuda") and dev.type != "cuda":
            raise ConfigError(
                "backend",
                f"{self.backend!r} captures a CUDA graph; use it with `device=cuda`, not {self.device} (on the CPU: jit, eager, aoti or compile)",
            )
        if self.backend in ("aoti", "compile"):
            from rollcap.kernels.compiled import cxx_compiler

            if dev.type != "cpu":
                raise ConfigError("backend", f"{self.backend!r} is a CPU plan; use 'cuda' on {self.device}")
            if cxx_compiler() is None:
                raise ConfigError(
                    "backend",
                    f"{self.backend!r} compiles C++ and found no compiler (g++ or $CXX) on PATH; install one or use 'jit'",
                )
        if dev.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count == 0 or (dev.index or 0) >= count:
                raise ConfigError("device", f"{self.device!r} is not available here ({count} CUDA device(s) visible)")


def shipped_models(env_id: str) -> tuple[Path, Path]:
    """The shipped policy and critic for ``env_id``: the MT10 pair on a MetaWorld MT10 task, else the built-in task's."""
    from rollcap.critics import MT10_CHECKPOINT as MT10_CRITIC
    from rollcap.envs.metaworld import ID_PREFIX, MT10
    from rollcap.policies import MT10_CHECKPOINT as MT10_POLICY

    if env_id.startswith(ID_PREFIX) and env_id.removeprefix(ID_PREFIX) in MT10:
        return MT10_POLICY, MT10_CRITIC
    return DEFAULT_POLICY, DEFAULT_CRITIC


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``"module:Env-v0"`` -> ``("module", "Env-v0")``; a plain id -> ``(None, id)``."""
    module, sep, plain = env_id.partition(":")
    return (module, plain) if sep else (None, env_id)


def make_env(env_id: str = DEFAULT_ENV, env_kwargs: dict | None = None, source: str | None = None):
    """``gym.make`` with rollcap's envs registered, gymnasium MuJoCo envs given exact state.

    A MuJoCo env without exact state of its own is wrapped in
    :class:`~rollcap.envs.ExactStateWrapper`, so its runs record an initial
    state and replay in env mode. An env made from ``module:Env`` (a module
    that registers it, e.g. ``gymnasium_robotics:FetchReach-v4``) keeps that id
    as its ``spec.id``, so its recordings name the module to import; rollcap's
    and gymnasium's own ids stay plain (:data:`OWN_PACKAGES`).

    Args:
        source: the file ``env_id`` was read from, if any. An id read from a
            file must be registered, and a ``module:Env`` id's module already
            imported: gymnasium would otherwise import a module the user never
            named (:func:`named_env` checks the id a user names instead).

    Raises:
        ConfigError: unknown id or bad kwargs (naming ``env_id`` / ``env_kwargs``).
    """
    from rollcap import envs  # registers rollcap/*

    module, plain = split_env_id(env_id)
    if source is not None and (plain not in gym.registry or (module is not None and module not in sys.modules)):
        how = (f"the {module} package registers it, and a module a file names is never imported: pass --env {env_id} to allow it" if module is not None
               else f"if a package registers it, pass --env PACKAGE:{plain} (a module a file names is never imported)")  # fmt: skip
        raise ConfigError(
            "env_id", f"{source}: the recording's env id {env_id!r} is not a registered gymnasium env here; {how}"
        )
    where = f"{source}: " if source else ""
    try:
        own = module is None or module.split(".")[0] in OWN_PACKAGES
        if not own:
            importlib.import_module(module)  # what gym.make does for a module:id; the spec then keeps the module
        if "gymnasium_robotics" in sys.modules:
            from rollcap.envs.robotics import fix_joint_types

            fix_joint_types()  # gymnasium-robotics 1.4 cannot build a Fetch env on MuJoCo 4 without it
        if not own:
            env = gym.make(dataclasses.replace(gym.spec(plain), id=env_id), **(env_kwargs or {}))
        else:
            env = gym.make(env_id, **(env_kwargs or {}))
    except gym.error.Error as err:
        raise ConfigError("env_id", f"{where}{env_id!r}: {err}") from err
    except ModuleNotFoundError as err:
        raise ConfigError("env_id", f"{where}{env_id!r}: {err}") from err
    except (TypeError, ValueError, MemoryError) as err:
        raise ConfigError("env_kwargs", f"{where}{env_id}: {err}") from err  # MemoryError: "Unable to allocate ..."
    except Exception as err:  # the env's own code failed: one line naming the env and the cause, not its traceback
        raise ConfigError("env_id", f"{where}{env_id!r} failed to build: {_cause(err)}") from err
    if envs.exact_state_of(env) is None:
        wrapped = envs.ExactStateWrapper(env)
        if wrapped.exact_state:
            return wrapped
    return env


def _cause(err: BaseException) -> str:
    """``Type: message`` of an exception, and where it was raised when the message is empty (a bare ``assert``)."""
    text = str(err).strip().splitlines()
    if text:
        return f"{type(err).__name__}: {text[0]}"
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (
        f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
        if tb is not None
        else ""
    )
    return f"{type(err).__name__}{where}"


def named_env(recorded: str, named: str | None, source) -> bool:
    """Whether the recording ``source``'s env (id ``recorded``) may be built with imports: the user named it (``--env``).

    ``named`` must name the recording's env: its recorded id, or ``module:id``
    for a recording of the plain ``id`` (made from an env object, or before
    ids kept their module), whose ``module`` is then imported here: the user
    named it. ``None``: nothing may be imported (:func:`make_env` ``source``).

    Raises:
        ConfigError: (field ``env``) ``named`` is another env, or its module cannot be imported or does not register it.
    """
    if named is None:
        return False
    if named == recorded:
        return True
    module, plain = split_env_id(named)
    recorded_module, recorded_plain = split_env_id(recorded)
    if module is not None and recorded_module is None and plain == recorded:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            raise ConfigError("env", f"{named}: {err}") from err
        if plain not in gym.registry:
            raise ConfigError("env", f"{named}: importing {module} registers no {plain!r}")
        return True
    if recorded_module is not None and plain == recorded_plain:
        raise ConfigError(
            "env",
            f"{named}: {source} was recorded in {recorded}; name it as recorded, `env={recorded}` (rollcap then imports {recorded_module})",
        )
    raise ConfigError(
        "env", f"{named}: {source} was recorded in {recorded}; the recording's env is always used (drop `env`)"
    )


def check_fits(env, spec, label: str = "policy", field: str = "env_id", source: str | None = None) -> None:
    """Refuse an env whose observations a model with observation spec ``spec`` cannot read.

    ``source``: the recording the env was read from (it cannot change): the message names it.

    Raises:
        ConfigError: naming ``field`` (the env id, the kwargs that made it, or the model), what the env gives and what the model reads.
    """
    space = env.observation_space
    name = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
    name = f"{source}: {name}" if source else name
    want = {k: (spec.image_size, spec.image_size, 3) for k in spec.image_keys} | {"state": (spec.state_dim,)}
    if not isinstance(space, gym.spaces.Dict):
        raise ConfigError(
            field,
            f"{name} observations are a {type(space).__name__} space; the {label} reads a dict {want} plus 'instruction'",
        )
    have = {k: tuple(s.shape) for k, s in space.spaces.items() if k != "instruction"}
    wrong = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
    if wrong or "instruction" not in space.spaces:
        what = ", ".join(f"{k} {h or 'missing'} (needs {w})" for k, (h, w) in wrong.items())
        if "instruction" not in space.spaces:
            what = ", ".join(filter(None, [what, "'instruction' missing"]))
        raise ConfigError(field, f"{name} does not fit the {label}: {what}")


NO_SHIPPED_POLICY = (
    "no shipped policy reads this env's observations (they read rollcap/PushBlock-v0's and the MetaWorld MT10 tasks'): "
    "record it with a policy of your own, rollcap.run(env=..., policy=...) (examples/custom_policy.py; for Fetch, examples/fetch_reach.py)"
)
"""What a run of a shipped checkpoint on an env it cannot read adds to :func:`check_fits`' line."""


def _shipped_policies() -> set[Path]:
    from rollcap.policies import MT10_CHECKPOINT

    return {DEFAULT_POLICY, MT10_CHECKPOINT}


def _misfit_field(parts: Parts, label: str, source: str | None) -> str:
    """The field a model that cannot read the env names: the env's, or (the env read from ``source``) the model's."""
    return label if source else "env_kwargs" if parts.env_kwargs else "env_id"


def make_runners(
    parts: Parts, env=None, rtc: bool = False, source: str | None = None
) -> tuple[PolicyRunner, CriticRunner | None]:
    """Load the checkpoints and capture their graphs, each on its own lane (no critic if ``parts.critic`` is None).

    ``parts.policy`` ``lerobot:DIR`` is a :class:`~rollcap.policies.lerobot.LeRobotPolicy` (eager unless ``parts.backend``
    names jit / cuda) and
    ``expert[:STD]`` an :class:`ExpertPolicy`; neither carries a prefix, so ``rtc`` is refused by the host.

    With ``env``, both models are checked against its observations (:func:`check_fits`) before anything is captured.
    ``rtc``: the policy is an :class:`~rollcap.policies.rtc.RTCPolicyRunner` (real-time chunking, ``HostConfig.chunking`` naive / rtc).
    ``source``: the recording ``env`` was read from: a model that cannot read it is the one to change (the error names ``policy`` / ``critic`` and the file).
    """
    named = _named_policy(parts, env)
    if named is not None:
        critic = make_critic(parts, env) if parts.critic is not None else None
        return named, critic
    model = load_policy(parts.policy)
    if env is not None:
        try:
            check_fits(env, model.cfg.obs_spec, "policy", _misfit_field(parts, "policy", source), source)
        except ConfigError as err:
            if Path(parts.policy) not in _shipped_policies():
                raise
            raise ConfigError(err.field, f"{err.problem}; {NO_SHIPPED_POLICY}") from None
    model = policy_model(parts, model)
    critic = make_critic(parts, env, source) if parts.critic is not None else None
    runner = RTCPolicyRunner if rtc else PolicyRunner
    return runner(
        model, parts.device, parts.backend, make_lane("policy", parts.device, parts.threads), precision=parts.precision
    ), critic


def policy_model(parts: Parts, model):
    """``model`` (a loaded FlowVLA checkpoint) as ``parts.sampler`` runs it: itself, fused (:func:`rollcap.policies.fused.fuse`) or lean (:func:`rollcap.policies.lean.lean`)."""
    if parts.sampler not in ("fused", "lean"):
        return model
    from rollcap.kernels.fingerprint import tensor_digest
    from rollcap.policies.fused import fuse
    from rollcap.policies.lean import lean

    return (fuse if parts.sampler == "fused" else lean)(model, tensor_digest(dict(model.state_dict())))


def make_critic(parts: Parts, env=None, source: str | None = None) -> CriticRunner:
    """Load ``parts.critic`` and capture it on its own lane (checked against ``env``'s observations first; ``source`` as for :func:`make_runners`)."""
    model = load_critic(parts.critic)
    if env is not None:
        check_fits(env, model.cfg.obs_spec, "critic", _misfit_field(parts, "critic", source), source)
    return CriticRunner(
        model, parts.device, parts.backend, make_lane("critic", parts.device, parts.threads), precision=parts.precision
    )


# ------------------------------------------------------- named policies
LEROBOT_PREFIX, EXPERT = "lerobot:", "expert"


def named_policy(policy) -> tuple[str, str] | None:
    """``("lerobot", DIR)`` or ``("expert", "expert[:STD]")`` for a policy named so, None for a checkpoint path."""
    text = str(policy)
    if text.startswith(LEROBOT_PREFIX):
        return "lerobot", text[len(LEROBOT_PREFIX) :]
    if re.fullmatch(rf"{EXPERT}(:.*)?", text):
        return "expert", text
    return None


def _check_policy_name(parts: Parts) -> None:
    """Refuse a malformed ``lerobot:`` / ``expert:`` name before anything is built (ConfigError naming ``policy``);
    a LeRobot directory is made absolute (actors may run in another directory)."""
    named = named_policy(parts.policy)
    if named is None:
        return
    kind, arg = named
    if kind == "expert":
        ExpertPolicy.parse(arg)
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


def _named_policy(parts: Parts, env=None):
    """The policy ``parts.policy`` names when it is not a checkpoint of ours (``lerobot:DIR``, ``expert[:STD]``), else None."""
    named = named_policy(parts.policy)
    if named is None:
        return None
    kind, arg = named
    if kind == "expert":
        return expert_policy(arg, env)
    if parts.precision != "fp32":
        raise ConfigError(
            "precision",
            f"{parts.precision}: a LeRobot policy runs at its own dtype (fp32 here); the setting applies to rollcap's graphs",
        )
    from rollcap.policies.lerobot import BACKENDS as LEROBOT_BACKENDS
    from rollcap.policies.lerobot import LeRobotPolicy, map_features

    backend = (
        parts.backend or "eager"
    )  # the default: every LeRobot recording before capture existed was eager, and replays so
    if backend not in LEROBOT_BACKENDS or (backend != "eager" and backend != default_backend(parts.device)):
        raise ConfigError(
            "backend",
            f"{backend!r}: a LeRobot policy on {parts.device} runs 'eager' or {default_backend(parts.device)!r} ({LEROBOT_PREFIX}{arg})",
        )
    torch.set_num_threads(
        parts.threads
    )  # it runs on the host's thread: torch's default (every core) measured 168 ms vs 1.5 ms a chunk beside a busy core
    try:
        policy = LeRobotPolicy.load(arg, device=parts.device, backend=backend, threads=parts.threads)
        if env is not None and isinstance(env.observation_space, gym.spaces.Dict):
            map_features(policy.cfg.input_features, list(env.observation_space.spaces))
    except (ValueError, ImportError) as err:
        raise ConfigError("policy", f"{LEROBOT_PREFIX}{arg}: {str(err).splitlines()[0]}") from err
    return policy


def expert_policy(name: str, env=None, env_id: str | None = None) -> ExpertPolicy:
    """``expert[:STD]`` for ``env`` (or the env with id ``env_id``, what a recording names; neither: the built-in task).

    Raises:
        ConfigError: (field ``policy``) the env has no scripted expert (:func:`rollcap.envs.experts.scripted_expert`).
    """
    from rollcap.envs.experts import scripted_expert

    std = ExpertPolicy.parse(name)
    try:
        return ExpertPolicy(std, scripted_expert(env, env_id))
    except ValueError as err:
        raise ConfigError("policy", f"{name}: {err}") from err


class ExpertPolicy:
    """An env's scripted expert as a :class:`~rollcap.rollout.protocols.ChunkPolicy` (``--policy expert``).

    The script (:mod:`rollcap.envs.experts`: the built-in task's, or a MetaWorld
    task's from ``metaworld.policies``) is reactive: a chunk of one action per
    boundary, read from the current observation. ``std`` > 0 adds ``std x``
    the host's noise to that action (DART-style exploration, clipped to
    [-1, 1]), so a noisy demo is still a pure function of the episode seed and
    replays exactly. Single caller: the host's thread.
    """

    execute_steps = 1

    def __init__(self, std: float = 0.0, script=None):
        from rollcap.envs.experts import PushBlockScript

        self.std = float(std)
        self._script = script if script is not None else PushBlockScript()
        self.chunk_shape = (1, int(self._script.action_dim))
        self._chunk: np.ndarray | None = None

    @staticmethod
    def parse(name: str) -> float:
        """``expert`` -> 0.0, ``expert:0.1`` -> 0.1; a ConfigError naming ``policy`` otherwise."""
        text = name.removeprefix(EXPERT).removeprefix(":") or "0"
        try:
            std = float(text)
        except ValueError:
            std = -1.0
        if not (0.0 <= std <= 1.0):
            raise ConfigError("policy", f"{name}: expected expert or expert:STD with 0 <= STD <= 1")
        return std

    def reset(self) -> None:
        """Episode start: the clean expert keeps no state between episodes; a chunk not yet taken is dropped."""
        self._script.reset()
        self._chunk = None

    def start(self, obs, noise: np.ndarray) -> None:
        """The expert's action for ``obs`` (plus ``std`` x ``noise``), ready when this returns."""
        noise = np.asarray(noise, np.float32)
        if noise.shape != self.chunk_shape:
            raise ValueError(f"noise: expected {self.chunk_shape}, got {noise.shape}")
        action = self._script.act(obs)
        if self.std:
            action = np.clip(action + np.float32(self.std) * noise[0], -1.0, 1.0).astype(np.float32)
        self._chunk = action[None].copy()

    def result(self) -> np.ndarray:
        """The chunk :meth:`start` computed, float32 ``[1, A]``."""
        if self._chunk is None:
            raise RuntimeError("result() called without a successful start()")
        out, self._chunk = self._chunk, None
        return out

    def state_fingerprint(self) -> dict:
        """The expert and its noise (numpy only: no weights); a MetaWorld expert also names its class and metaworld's version."""
        return {
            "kind": "rollcap.expert",
            "std": self.std,
            "noise": "injected" if self.std else "not an input",
            "numpy": np.__version__,
            **self._script.fingerprint(),
        }

    def close(self) -> None:
        """Nothing to release."""
