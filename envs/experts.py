"""Which scripted expert drives an env (``--policy expert``): the built-in PushBlock's, or a MetaWorld task's.

:func:`scripted_expert` finds the env's task, from the env (its wrappers) or
from its id (what a recording names), and returns a :class:`Script`: one
clean action per call for the current observation. The rollout's
``ExpertPolicy`` adds the host's noise on top and records it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from rollcap.envs.adapters import env_name
from rollcap.envs.expert import ScriptedExpert
from rollcap.envs.metaworld import ID_PREFIX, STATE_DIM, TASKS, MetaWorldObservation
from rollcap.envs.push_block import ENV_ID as PUSH_BLOCK_ID
from rollcap.envs.push_block import PushBlockConfig, PushBlockEnv


class Script(Protocol):
    """A scripted expert: ``action_dim`` wide actions in [-1, 1], read from one observation at a time."""

    action_dim: int

    def reset(self) -> None:
        """An episode starts."""

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        """The clean float32 action for ``obs`` (clipped to [-1, 1])."""

    def fingerprint(self) -> dict:
        """What the action depends on besides the observation (JSON-able; merged into the policy's fingerprint)."""


class PushBlockScript:
    """:class:`~rollcap.envs.expert.ScriptedExpert` without mistakes (the built-in task's expert)."""

    action_dim = 2

    def __init__(self, config: Any = None) -> None:
        """``config``: the env's :class:`~rollcap.envs.push_block.PushBlockConfig` (default: the built-in one), whose
        scene, speed and control period the expert's actions are scaled by."""
        self._expert = ScriptedExpert.for_env(config or PushBlockConfig())

    def reset(self) -> None:
        self._expert.reset(0)

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        return self._expert.act(obs)

    def fingerprint(self) -> dict:
        return {}  # as before MetaWorld had experts: recordings of the PushBlock expert stay comparable


class MetaWorldScript:
    """A MetaWorld v3 task's scripted policy (``metaworld.policies``) on rollcap's observation dict.

    It reads ``state`` (MetaWorld's flat 39-number observation, as float32 in
    the dict; given to the policy as float64) and keeps nothing between calls
    (MetaWorld's policies hold no state). Its action is clipped to [-1, 1]
    (the env clips it the same way; the policies' gains go beyond) and cast to float32.
    """

    action_dim = 4

    def __init__(self, task: str) -> None:
        try:
            from metaworld.policies import ENV_POLICY_MAP
        except ImportError as err:
            raise ValueError(f"the MetaWorld experts need metaworld ({err})") from err
        if task not in ENV_POLICY_MAP:
            raise ValueError(f"MetaWorld has no scripted expert for {task!r}")
        cls = ENV_POLICY_MAP[task]
        self.task, self.name, self._policy = task, f"{cls.__module__}.{cls.__qualname__}", cls()

    def reset(self) -> None:
        """Nothing to reset (the policy reads the observation only)."""

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        state = np.asarray(obs["state"], dtype=np.float64)
        if state.shape != (STATE_DIM,):
            raise ValueError(f"obs['state']: expected MetaWorld's ({STATE_DIM},) observation, got shape {state.shape}")
        with (
            warnings.catch_warnings()
        ):  # "Constant(s) may be too high. Environments clip response to [-1, 1]": clipped here
            warnings.filterwarnings("ignore", "Constant", UserWarning)
            action = self._policy.get_action(state)
        return np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0).astype(np.float32)

    def fingerprint(self) -> dict:
        from importlib.metadata import version

        return {"expert": self.name, "task": self.task, "metaworld": version("metaworld")}


def expert_task(env: Any = None, env_id: str | None = None) -> str | None:
    """The task whose expert drives ``env`` (or, without one, the env with id ``env_id``).

    ``"push-block"`` for the built-in task, a MetaWorld task name (``"push-v3"``),
    or None when rollcap has no expert for it. Neither given: ``"push-block"``
    (the default env).
    """
    if env is not None:
        layer = env
        while layer is not None:
            if isinstance(layer, MetaWorldObservation):
                return layer.task
            if isinstance(layer, PushBlockEnv):
                return "push-block"
            layer = getattr(layer, "env", None)
        return None
    if env_id is None:
        return "push-block"
    plain = env_id.partition(":")[2] or env_id
    if plain == PUSH_BLOCK_ID:
        return "push-block"
    task = plain.removeprefix(ID_PREFIX) if plain.startswith(ID_PREFIX) else None
    return task if task in TASKS else None


def scripted_expert(env: Any = None, env_id: str | None = None) -> Script:
    """The scripted expert of ``env`` (or of the env with id ``env_id``; neither: the built-in task's).

    Raises:
        ValueError: rollcap has no scripted expert for that env, or metaworld is not installed.
    """
    task = expert_task(env, env_id)
    if task is None:
        name = env_id or env_name(env)
        raise ValueError(f"{name} has no scripted expert (there is one for {PUSH_BLOCK_ID} and each {ID_PREFIX}<task>)")
    if task != "push-block":
        return MetaWorldScript(task)
    layer = env
    while layer is not None and not isinstance(layer, PushBlockEnv):
        layer = getattr(layer, "env", None)
    return PushBlockScript(
        layer.config if layer is not None else None
    )  # the env's speed and control period (the relabeller's too)
