"""Build: from a spec (:mod:`rollcap.rollout.spec`) to envs and runners, at any batch.

:func:`build` is the one function every entry point builds through (``rollcap.run``
and the CLI's ``run``, the gym vector env, Ray actors, replay and branch): it makes
the envs, probes the machine (:func:`probe`: a GPU, a compiler), checks the
models fit the env and captures the policy and critic graphs at the batch
(``envs``, split over ``graphs``). :func:`runners` is its model half (replay
rebuilds a recording's runners with it, at the recorded batch), and
:func:`policy_runner` / :func:`critic_runner` are the only places a runner is
constructed (``tests/rollout/test_build.py`` fails on another).
Importing it imports no torch (env workers make envs with :func:`make_env`): runners' modules load where they are made.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import warnings
from dataclasses import dataclass, field

import gymnasium as gym

from rollcap import critics, envs, kernels, policies  # packages whose names are imported on first use
from rollcap.envs import probe_exactness
from rollcap.envs.errors import mujoco_warnings
from rollcap.rollout.config import check_batched_host
from rollcap.rollout.errors import ConfigError, NotExactWarning, cause_of
from rollcap.rollout.fits import check_model_fits
from rollcap.rollout.spec import (
    DEFAULT_ENV,
    Parts,
    Spec,
    auto_env_workers,
    is_name,
    named_policy,
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
        raise ConfigError("env_id", f"{where}{env_id!r} failed to build: {cause_of(err)}") from err
    if envs.exact_state_of(env) is None:
        wrapped = envs.ExactStateWrapper(env)
        if wrapped.exact_state:
            return wrapped
    return env


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


# ----------------------------------------------------------------- build
@dataclass
class Built:
    """What :func:`build` made, always as lists: the envs, the policy and critic runners, and what to close."""

    envs: list
    """The envs made here: ``batch`` of them, or one (for the checks) when env workers make the batch's."""
    policies: list = field(default_factory=list)
    """G policy runners at batch ``batch // G`` (``graphs``; one at batch 1), or the caller's policy object alone."""
    critics: list = field(default_factory=list)
    """A critic runner per policy runner, the caller's critic object alone, or none (a run without a critic)."""
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


def build(spec: Spec, poll=None, check_env: bool = True) -> Built:
    """Envs and runners for ``spec``: ``spec.run.envs`` envs (one with ``env_workers``: the workers make the
    batch's), the policy and critic captured at that batch.

    The deployment's env, policy and critic are names (an env id, checkpoints: built here) or objects of the
    caller's (used as they are; :func:`~rollcap.rollout.spec.is_name`). At batch N > 1, with env workers or on
    actors all three must be names: N envs are built from the id and the checkpoints captured at batch N
    (``graphs`` G: G pairs at N/G). ``poll`` is called after the envs and after the runners are built (it raises
    to stop start-up there). ``check_env``: the first env is probed for repeatability (:func:`check_repeatable`,
    ``spec.run.require_exact``) before anything is captured.

    Raises:
        ConfigError: naming the field at fault; what was built so far is closed.
    """
    spec = for_this_machine(spec)  # env_workers "auto": a count
    parts, run, poll = spec.deployment, spec.run, poll or (lambda: None)
    n = run.envs
    here = 1 if run.env_workers else n  # env workers build their slots' envs; this process one, for the checks
    env, policy, critic, out = parts.env_id, parts.policy, parts.critic, Built([], batch=n)
    try:
        if run.env_workers and not parts.names_only:
            raise ConfigError(
                "env_workers",
                "env workers build their envs from an env id and the runners from checkpoints; got objects",
            )
        if n > 1 and not run.env_workers:
            if not is_name(env):
                raise ConfigError(
                    "envs",
                    f"a batched run builds its {n} envs from an env id; got an env object ({type(env).__name__})",
                )
            if not parts.names_only:
                raise ConfigError(
                    "envs",
                    f"a batched run captures the policy and critic at batch {n} from checkpoints; got a {type(policy).__name__} / {type(critic).__name__} object",
                )
            check_batched_host(spec.host)
        if is_name(env):
            for _ in range(here):
                out.envs.append(make_env(env, parts.env_kwargs))
                out.own.append(out.envs[-1])
            poll()
        else:
            out.envs.append(env)
        if check_env:
            check_repeatable(out.env, run.require_exact)
        if is_name(policy):
            rtc = spec.host.chunking != "sync"
            out.policies, out.critics = runners(parts, out.env, envs=n, graphs=run.graphs, rtc=rtc)
            out.own += out.policies + out.critics
        else:
            out.policies = [policy]
            out.critics = [make_critic(parts, out.env)] if is_name(critic) else [] if critic is None else [critic]
            out.own += out.critics if is_name(critic) else []
        poll()
    except BaseException:
        out.close()
        raise
    return out


def for_this_machine(spec: Spec) -> Spec:
    """``spec`` with ``env_workers="auto"`` settled to a count for this machine (:func:`auto_env_workers`)."""
    run = spec.run
    if run.env_workers != "auto":
        return spec
    count = 0 if spec.no_env_workers_with else auto_env_workers(run.envs, run.graphs)
    return dataclasses.replace(spec, run=dataclasses.replace(run, env_workers=count))


def _plain_env(parts: Parts):
    """``parts``' env made with its default kwargs, when asked (:func:`~rollcap.rollout.fits.check_model_fits`);
    None for an env object of yours (nothing to make again)."""
    return (lambda: make_env(parts.env_id)) if is_name(parts.env_id) else None


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


def device_missing(device) -> str | None:
    """Why ``device`` (a name or a ``torch.device``) cannot be used here (None: it can): not a device, or a CUDA device it lacks."""
    import torch

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
    """What this machine must have for ``parts``: a LeRobot policy's directory and lerobot itself, the CUDA device
    (and its float8 cores for fp8), a C++ compiler for a compiled CPU plan.

    Raises:
        ConfigError: naming ``policy``, ``backend`` or ``device``.
    """
    if (named := named_policy(parts.policy)) is not None and named[0] == "lerobot":
        from rollcap.rollout.named import check_lerobot  # (imports torch)

        check_lerobot(named[1])
    if parts.backend in ("aoti", "compile"):
        from rollcap.kernels.compiled import cxx_compiler

        if cxx_compiler() is None:
            raise ConfigError(
                "backend",
                f"{parts.backend!r} compiles C++ and found no compiler (g++ or $CXX) on PATH; install one or use 'jit'",
            )
    missing = device_missing(parts.device)
    if missing is not None:
        raise ConfigError("device", missing)
    if parts.device.startswith("cuda"):  # (Parts checked it is cpu or cuda[:i])
        from rollcap.kernels.precision import check_precision

        try:
            check_precision(parts.precision, parts.device)  # fp8: this GPU's float8 tensor cores
        except ValueError as err:
            raise ConfigError("precision", str(err)) from None


def runners(
    parts: Parts, env=None, *, envs: int = 1, graphs: int = 1, rtc: bool = False, source: str | None = None
) -> tuple[list, list]:
    """The one runner factory: ``parts``' checkpoints loaded and captured at batch ``envs``, each on its own lane.

    Returns ``(policies, critics)``: ``graphs`` runners each at batch ``envs // graphs`` (one at batch 1), and a
    critic runner per policy runner (none if ``parts.critic`` is None). ``parts.policy`` ``lerobot:DIR`` is a
    :class:`~rollcap.policies.lerobot.LeRobotPolicy` (eager unless ``parts.backend`` names jit / cuda) and
    ``expert[:STD]`` an :class:`ExpertPolicy`; neither has a batched graph nor carries a prefix (``rtc`` is
    refused by the host).

    With ``env``, both models are checked against its observations (:func:`~rollcap.rollout.fits.check_model_fits`) before anything is captured.
    ``rtc``: the policy is an :class:`~rollcap.policies.rtc.RTCPolicyRunner` (real-time chunking, ``HostConfig.chunking`` naive / rtc).
    ``source``: the recording ``env`` was read from: a model that cannot read it is the one to change (the error names ``policy`` / ``critic`` and the file).
    """
    probe(parts)
    pairs = [_pair(parts, env if g == 0 else None, envs // graphs, rtc, source) for g in range(graphs)]
    return [p for p, _ in pairs], [c for _, c in pairs if c is not None]


def _pair(parts: Parts, env, envs: int, rtc: bool, source: str | None):
    """One graph's policy runner and critic runner (None without a critic) at batch ``envs``."""
    from rollcap.rollout.named import named_runner

    if envs > 1 and named_policy(parts.policy) is not None:
        raise ConfigError("envs", f"a batched run needs a FlowVLA checkpoint; {parts.policy} has no batched graph")
    named = named_runner(parts, env)
    if named is not None:
        return named, make_critic(parts, env) if parts.critic is not None else None
    model = policies.load_policy(parts.policy)
    critic_model = critics.load_critic(parts.critic) if parts.critic is not None and envs > 1 else None
    if env is not None:
        check_model_fits(env, model.cfg.obs_spec, "policy", parts, source, _plain_env(parts))
        if critic_model is not None:
            check_model_fits(env, critic_model.cfg.obs_spec, "critic", parts, source, _plain_env(parts))
    model = policy_model(parts, model)
    if envs > 1:
        policy = policy_runner(model, parts, envs=envs)
        return policy, None if critic_model is None else critic_runner(critic_model, parts, envs=envs)
    critic = make_critic(parts, env, source) if parts.critic is not None else None
    return policy_runner(model, parts, rtc=rtc), critic


def make_runners(
    parts: Parts, env=None, rtc: bool = False, source: str | None = None, *, envs: int = 1
) -> tuple[policies.PolicyRunner, critics.CriticRunner | None]:
    """One graph of :func:`runners` at batch ``envs`` (1: what one episode at a time runs on); no critic: None."""
    (policy,), critics = runners(parts, env, envs=envs, rtc=rtc, source=source)
    return policy, critics[0] if critics else None


def make_critic(parts: Parts, env=None, source: str | None = None) -> critics.CriticRunner:
    """Load ``parts.critic`` and capture it on its own lane (checked against ``env``'s observations first; ``source`` as for :func:`runners`)."""
    model = critics.load_critic(parts.critic)
    if env is not None:
        check_model_fits(env, model.cfg.obs_spec, "critic", parts, source, _plain_env(parts))
    return critic_runner(model, parts)


def policy_runner(model, parts: Parts | None = None, *, envs: int = 1, rtc: bool = False, **options):
    """The one place a policy runner is made: ``model`` captured where and how ``parts`` says (its own lane), at
    batch ``envs``; ``rtc``: an :class:`~rollcap.policies.rtc.RTCPolicyRunner`; sampler sde: a
    :class:`~rollcap.policies.flow_sde.FlowSDERunner` (rtc with it is refused by the spec). Without ``parts``: the
    runner's defaults. ``options``: the runner's own arguments (``backend``, ``lane``, ``sampler``, ...)."""
    if parts is not None and parts.sampler == "sde":
        return _runner(
            policies.FlowSDERunner, "policy", model, parts, envs, {"noise_level": parts.noise_level, **options}
        )
    from rollcap.policies.rtc import RTCPolicyRunner

    return _runner(RTCPolicyRunner if rtc else policies.PolicyRunner, "policy", model, parts, envs, options)


def critic_runner(model, parts: Parts | None = None, *, envs: int = 1, **options):
    """The one place a critic runner is made (see :func:`policy_runner`)."""
    return _runner(critics.CriticRunner, "critic", model, parts, envs, options)


def _runner(cls, label: str, model, parts: Parts | None, envs: int, options: dict):
    if parts is not None:
        lane = kernels.make_lane(label, parts.device, parts.threads)
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
    from rollcap.policies.fused import fuse
    from rollcap.policies.lean import lean

    return (fuse if parts.sampler == "fused" else lean)(model, kernels.tensor_digest(dict(model.state_dict())))
