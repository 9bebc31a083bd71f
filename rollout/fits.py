"""Whether a model reads an env's observations, and which flag to name when it does not.

:func:`check_fits` compares an env's observation space with a model's observation spec; :func:`check_model_fits`
names the flag to change: ``--env-kwargs`` when the kwargs are the cause (the env with its defaults fits), else the
model's own (``--policy`` / ``--critic``), and for a shipped model what runs there instead (``--policy expert`` on a
MetaWorld task, ``--critic none``). :mod:`rollcap.rollout.build` checks every model it builds here.

Imports point downward: ``policies``, ``critics``, ``envs`` (names), ``errors``, ``spec``.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.critics import MT10_CHECKPOINT as MT10_CRITIC
from rollcap.envs.adapters import env_name
from rollcap.envs.metaworld import ID_PREFIX
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies import MT10_CHECKPOINT
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.spec import Parts


def check_fits(env, spec, label: str = "policy", field: str = "env_id", source: str | None = None) -> None:
    """Refuse an env whose observations a model with observation spec ``spec`` cannot read.

    ``source``: the recording the env was read from (it cannot change): the message names it.

    Raises:
        ConfigError: naming ``field`` (the env id, the kwargs that made it, or the model), what the env gives and what the model reads.
    """
    space = env.observation_space
    name = env_name(env)
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
NO_SHIPPED_EXPERT = "--policy expert runs the task's scripted expert (every MetaWorld task has one); or "
"""What that line says first on a MetaWorld task (outside MT10, which the shipped MT10 policy reads)."""
NO_SHIPPED_CRITIC = (
    "no shipped critic reads this env's observations: --critic none runs without one, or name a critic of your own"
)
"""What a run of the shipped critic on an env it cannot read adds."""


def _shipped_policies() -> set[Path]:
    return {DEFAULT_POLICY, MT10_CHECKPOINT}


def check_model_fits(env, spec, label: str, parts: Parts, source: str | None = None, plain=None) -> None:
    """:func:`check_fits` for ``parts``' ``label`` model (its observation spec ``spec``), naming the flag to change: the
    env kwargs when they are what the model cannot read (``plain()``, the env made with its default kwargs, fits),
    else the model's own (``policy`` / ``critic``; a shipped one says what runs here instead).

    Raises:
        ConfigError: as :func:`check_fits`.
    """
    try:
        check_fits(env, spec, label, label, source)
    except ConfigError as err:
        if source is None and parts.env_kwargs and plain is not None and _fits_by_default(plain, spec, label):
            raise ConfigError("env_kwargs", err.problem) from None
        shipped = Path(str(getattr(parts, label))) in (_shipped_policies() if label == "policy" else _shipped_critics())
        if not shipped:
            raise
        hint = NO_SHIPPED_POLICY if label == "policy" else NO_SHIPPED_CRITIC
        if label == "policy" and isinstance(parts.env_id, str) and parts.env_id.startswith(ID_PREFIX):
            hint = hint.replace("record it with", NO_SHIPPED_EXPERT + "record it with", 1)
        raise ConfigError(label, f"{err.problem}; {hint}") from None


def _shipped_critics() -> set[Path]:
    return {DEFAULT_CRITIC, MT10_CRITIC}


def _fits_by_default(plain, spec, label: str) -> bool:
    """Whether the env ``plain()`` makes (with its default kwargs) gives observations a model of ``spec`` reads."""
    try:
        env = plain()
    except ConfigError:
        return False
    try:
        check_fits(env, spec, label)
        return True
    except ConfigError:
        return False
    finally:
        env.close()
