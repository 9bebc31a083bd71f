"""Build: from a spec (:mod:`rollcap.rollout.spec`) to envs and runners, at any batch.

:func:`build` is the one function every entry point builds through (``rollcap.run``
and the CLI's ``run``, the gym vector env, Ray actors, replay and branch): it makes
the envs, probes the machine (:func:`probe`: a GPU, a compiler), checks the
models fit the env and captures the policy and critic graphs at the batch
(``envs``, split over ``graphs``). :func:`runners` is its model half (replay
rebuilds a recording's runners with it, at the recorded batch), and
:func:`policy_runner` / :func:`critic_runner` are the only places a runner is
constructed (``tests/rollout/test_build.py`` fails on another).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import torch

from rollcap import envs
from rollcap.critics import CriticRunner, load_critic
from rollcap.envs import probe_exactness
from rollcap.envs.errors import mujoco_warnings
from rollcap.kernels.compiled import cxx_compiler
from rollcap.kernels.fingerprint import tensor_digest
from rollcap.kernels.lanes import make_lane
from rollcap.kernels.precision import check_precision
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies import MT10_CHECKPOINT
from rollcap.policies import FlowSDERunner, PolicyRunner, load_policy
from rollcap.policies.fused import fuse
from rollcap.policies.lean import lean
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.rollout.errors import ConfigError, NotExactWarning
from rollcap.rollout.named import ExpertPolicy, expert_policy, named_runner  # noqa: F401 - re-exported (replay, tests)
from rollcap.rollout.spec import (  # noqa: F401 - Parts and the policy names are re-exported: this module's old API
    DEFAULT_ENV,
    EXPERT,
    LEROBOT_PREFIX,
    Parts,
    RunConfig,
    Spec,
    check_batched_host,
    expert_std,
    is_path,
    named_policy,
    shipped_models,
)

OWN_PACKAGES = ("rollcap", "gymnasium")
"""Packages whose env ids a recording keeps plain: ``module:id`` naming one of them records ``id``."""


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
            from rollcap.envs.robotics import fix_joint_types  # an optional dependency: only with gymnasium_robotics

            fix_joint_types()  # gymnasium-robotics 1.4 cannot build a Fetch env on MuJoCo 4 without it
        with mujoco_warnings(env_id):  # MuJoCo's as Python warnings: no MUJOCO_LOG.TXT in the user's directory
            env = gym.make(env_id if own else dataclasses.replace(gym.spec(plain), id=env_id), **(env_kwargs or {}))
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
    return {DEFAULT_POLICY, MT10_CHECKPOINT}


def _misfit_field(parts: Parts, label: str, source: str | None) -> str:
    """The field a model that cannot read the env names: the env's, or (the env read from ``source``) the model's."""
    return label if source else "env_kwargs" if parts.env_kwargs else "env_id"


# ----------------------------------------------------------------- build
@dataclass
class Built:
    """What :func:`build` made: the envs (one per slot), the policy and critic, and what to close."""

    envs: list
    """The envs made here: ``batch`` of them, or one (for the checks) when env workers make the batch's."""
    policy: object
    """A runner at batch ``batch``, a list of G runners (``graphs``), or the caller's policy object."""
    critic: object
    own: list = field(default_factory=list)
    """What this build made (and :meth:`close` closes): not the caller's objects."""
    batch: int = 1

    @property
    def env(self):
        return self.envs[0]

    @property
    def batched(self) -> bool:
        return self.batch > 1

    def close(self) -> None:
        for part in self.own:
            if part is not None:
                part.close()


def build(spec: Spec, env=None, policy=None, critic=None, poll=None, check_env: bool = True) -> Built:
    """Envs and runners for ``spec``: ``spec.run.envs`` envs (one with ``env_workers``: the workers make the
    batch's), the policy and critic captured at that batch.

    ``env`` / ``policy`` / ``critic``: what the caller passed to ``rollcap.run`` (an env id or an env
    object; a checkpoint path or None, or a model object, which is used as it is). At batch N > 1 all
    three must be names: N envs are built from the id and the checkpoints captured at batch N
    (``graphs`` G: G pairs at N/G). ``poll`` is called after the envs and after the runners are built
    (it raises to stop start-up there). ``check_env``: the first env is probed for repeatability
    (:func:`check_repeatable`, ``spec.run.require_exact``) before anything is captured.

    Raises:
        ConfigError: naming the field at fault; what was built so far is closed.
    """
    parts, run, poll = spec.deployment, spec.run, poll or (lambda: None)
    n = run.envs
    here = 1 if run.env_workers else n  # env workers build their slots' envs; this process one, for the checks
    env = parts.env_id if env is None else env
    out = Built([], policy, critic, batch=n)
    try:
        if run.env_workers and not (isinstance(env, str) and is_path(policy) and is_path(critic)):
            raise ConfigError(
                "env_workers",
                "env workers build their envs from an env id and the runners from checkpoints; got objects",
            )
        if n > 1 and not run.env_workers:
            if not isinstance(env, str):
                raise ConfigError(
                    "envs",
                    f"a batched run builds its {n} envs from an env id; got an env object ({type(env).__name__})",
                )
            if not (is_path(policy) and is_path(critic)):
                raise ConfigError(
                    "envs",
                    f"a batched run captures the policy and critic at batch {n} from checkpoints; got a {type(policy).__name__} / {type(critic).__name__} object",
                )
            check_batched_host(spec.host)
        if isinstance(env, str):
            for _ in range(here):
                out.envs.append(make_env(parts.env_id, parts.env_kwargs))
                out.own.append(out.envs[-1])
            poll()
        else:
            out.envs.append(env)
        if check_env:
            check_repeatable(out.env, run.require_exact)
        if is_path(policy):
            rtc = spec.host.chunking != "sync"
            out.policy, built = runners(parts, out.env, envs=n, graphs=run.graphs, rtc=rtc)
            out.own += _flat(out.policy) + _flat(built)
        else:
            built = make_critic(parts, out.env) if parts.critic is not None else None
            out.own.append(built)
        out.critic = built if is_path(critic) else critic
        poll()
    except BaseException:
        out.close()
        raise
    return out


def _flat(part) -> list:
    return list(part) if isinstance(part, list) else [part]


def check_repeatable(env, require: bool = False) -> None:
    """Warn (:class:`NotExactWarning`) about an env that is not repeatable; with ``require``, refuse it, or one without exact state.

    :func:`rollcap.envs.probe_exactness` runs a seeded reset and a few steps
    twice on a copy of the env (the live env is left as it was) and looks for
    its exact state. An env that is repeatable but has no exact state (a
    plain gymnasium env) records without a warning: its episodes replay from
    the seed, and replay says which modes it could not check. Before anything
    is created.

    Raises:
        ConfigError: ``require`` and the env is not repeatable or not exact (naming ``require_exact``).
    """
    verdict = probe_exactness(env)
    if verdict.repeatable is not False and (verdict.exact or not require):
        return
    why = f"{verdict.env_name}: {verdict.reason}; its recordings will not replay exactly"
    if require:
        raise ConfigError("require_exact", why)
    warnings.warn(why, NotExactWarning, stacklevel=4)


def device_missing(device: str | torch.device) -> str | None:
    """Why ``device`` cannot be used on this machine (None: it can): not a device, or a CUDA device it lacks."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        return f"{str(device)!r} is not a device (cpu, cuda or cuda:N)"
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            return f"{str(device)!r} is not available here ({count} CUDA device(s) visible)"
    return None


def probe(parts: Parts) -> None:
    """What this machine must have for ``parts``: the CUDA device (and its float8 cores for fp8), a C++ compiler
    for a compiled CPU plan.

    Raises:
        ConfigError: naming ``backend`` or ``device``.
    """
    if parts.backend in ("aoti", "compile"):
        if cxx_compiler() is None:
            raise ConfigError(
                "backend",
                f"{parts.backend!r} compiles C++ and found no compiler (g++ or $CXX) on PATH; install one or use 'jit'",
            )
    dev = torch.device(parts.device)
    missing = device_missing(dev)
    if missing is not None:
        raise ConfigError("device", missing)
    if dev.type == "cuda":
        try:
            check_precision(parts.precision, dev)  # fp8: this GPU's float8 tensor cores
        except ValueError as err:
            raise ConfigError("precision", str(err)) from None


def runners(parts: Parts, env=None, *, envs: int = 1, graphs: int = 1, rtc: bool = False, source: str | None = None):
    """Load ``parts``' checkpoints and capture the policy and critic at batch ``envs``, each on its own lane.

    ``graphs`` > 1: that many (policy, critic) pairs at batch ``envs // graphs``, returned as two lists.
    No critic if ``parts.critic`` is None. ``parts.policy`` ``lerobot:DIR`` is a
    :class:`~rollcap.policies.lerobot.LeRobotPolicy` (eager unless ``parts.backend`` names jit / cuda) and
    ``expert[:STD]`` an :class:`ExpertPolicy`; neither has a batched graph nor carries a prefix (``rtc`` is
    refused by the host).

    With ``env``, both models are checked against its observations (:func:`check_fits`) before anything is captured.
    ``rtc``: the policy is an :class:`~rollcap.policies.rtc.RTCPolicyRunner` (real-time chunking, ``HostConfig.chunking`` naive / rtc).
    ``source``: the recording ``env`` was read from: a model that cannot read it is the one to change (the error names ``policy`` / ``critic`` and the file).
    """
    probe(parts)
    if graphs > 1:
        pairs = [runners(parts, env if g == 0 else None, envs=envs // graphs, source=source) for g in range(graphs)]
        return [p for p, _ in pairs], None if pairs[0][1] is None else [c for _, c in pairs]
    if envs > 1 and named_policy(parts.policy) is not None:
        raise ConfigError("envs", f"a batched run needs a FlowVLA checkpoint; {parts.policy} has no batched graph")
    named = named_runner(parts, env)
    if named is not None:
        return named, make_critic(parts, env) if parts.critic is not None else None
    model = load_policy(parts.policy)
    critic_model = load_critic(parts.critic) if parts.critic is not None and envs > 1 else None
    if env is not None:
        try:
            check_fits(env, model.cfg.obs_spec, "policy", _misfit_field(parts, "policy", source), source)
        except ConfigError as err:
            if Path(parts.policy) not in _shipped_policies() or envs > 1:
                raise
            raise ConfigError(err.field, f"{err.problem}; {NO_SHIPPED_POLICY}") from None
        if critic_model is not None:
            check_fits(env, critic_model.cfg.obs_spec, "critic", _misfit_field(parts, "critic", source), source)
    model = policy_model(parts, model)
    if envs > 1:
        policy = policy_runner(model, parts, envs=envs)
        return policy, None if critic_model is None else critic_runner(critic_model, parts, envs=envs)
    critic = make_critic(parts, env, source) if parts.critic is not None else None
    return policy_runner(model, parts, rtc=rtc), critic


def make_runners(
    parts: Parts, env=None, rtc: bool = False, source: str | None = None
) -> tuple[PolicyRunner, CriticRunner | None]:
    """:func:`runners` at batch 1 (the policy and critic one episode at a time runs on)."""
    return runners(parts, env, rtc=rtc, source=source)


def make_critic(parts: Parts, env=None, source: str | None = None) -> CriticRunner:
    """Load ``parts.critic`` and capture it on its own lane (checked against ``env``'s observations first; ``source`` as for :func:`runners`)."""
    model = load_critic(parts.critic)
    if env is not None:
        check_fits(env, model.cfg.obs_spec, "critic", _misfit_field(parts, "critic", source), source)
    return critic_runner(model, parts)


def policy_runner(model, parts: Parts | None = None, *, envs: int = 1, rtc: bool = False, **options):
    """The one place a policy runner is made: ``model`` captured as ``parts`` says (its own lane; none: defaults) at batch
    ``envs``; ``rtc``: an ``RTCPolicyRunner``; sampler sde: a ``FlowSDERunner``. ``options``: the runner's own arguments."""
    sde = {"noise_level": parts.noise_level} if parts is not None and parts.sampler == "sde" else None  # rtc: refused
    cls = FlowSDERunner if sde is not None else RTCPolicyRunner if rtc else PolicyRunner
    return _runner(cls, "policy", model, parts, envs, {**(sde or {}), **options})


def critic_runner(model, parts: Parts | None = None, *, envs: int = 1, **options):
    """The one place a critic runner is made (see :func:`policy_runner`)."""
    return _runner(CriticRunner, "critic", model, parts, envs, options)


def _runner(cls, label: str, model, parts: Parts | None, envs: int, options: dict):
    if parts is not None:
        lane = make_lane(label, parts.device, parts.threads)
        options = {
            "device": parts.device,
            "backend": parts.backend,
            "lane": lane,
            "precision": parts.precision,
            **options,
        }
    if envs != 1:
        options["batch"] = envs
    return cls(model, **options)


def policy_model(parts: Parts, model):
    """``model`` (a loaded FlowVLA checkpoint) as ``parts.sampler`` runs it: itself, fused (:func:`rollcap.policies.fused.fuse`) or lean (:func:`rollcap.policies.lean.lean`)."""
    if parts.sampler not in ("fused", "lean"):
        return model
    return (fuse if parts.sampler == "fused" else lean)(model, tensor_digest(dict(model.state_dict())))
