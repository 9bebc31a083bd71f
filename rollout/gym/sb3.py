"""Stable-Baselines3's door to the batched core: an SB3 ``VecEnv`` over rollcap's vector envs (one graph at batch N).

SB3 takes its own ``VecEnv`` and refuses gymnasium's vector envs ("not a Gymnasium environment"), so
``gym.make_vec("rollcap/NoiseSteerPushBlock-v0", N)`` cannot go to ``SAC(...)`` as it is. :class:`SB3VecEnv` speaks
SB3's interface over :class:`~rollcap.rollout.gym.vector.ChunkVectorEnv` /
:class:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv`: each ``step`` is one round of the batched core (every
sub-env's boundary written, one replay of the policy graph and one of the critic graph for all N, the chunks
executed on the core's thread pool), not N single envs each replaying its own graph::

    from stable_baselines3 import SAC
    from rollcap.rollout.gym.sb3 import make_sb3_vec_env

    venv = make_sb3_vec_env("rollcap/NoiseSteerPushBlock-v0", n_envs=8, state_only=True, noise_bound=1.5,
                            max_episode_steps=20)
    model = SAC("MultiInputPolicy", venv).learn(10_000)

SB3's conventions, from gymnasium's same-step autoreset: ``step_wait`` returns ``dones = terminated | truncated``
and, for a finished sub-env, the next episode's first observation; its info is the finished step's (``is_success``,
``stop_reason``, ``steps``, ``value``, ...) with ``terminal_observation`` (its last observation) and
``TimeLimit.truncated`` (cut, not ended: SB3 bootstraps from it), and the new episode's reset info
(``rollcap_episode``, ``rollcap_seed``, ``rollcap_index``) goes to ``reset_infos``. ``is_success`` is in every
finished sub-env's info, so SB3's ``rollout/success_rate`` counts every episode. Seeding is SB3's: ``seed(s)``
then ``reset()`` gives sub-env ``i`` the run ``s + i``, as rollcap's vector ``reset(seed=s)``. The sub-envs are
slots of one env, not N objects: ``get_attr`` reads the vector env's attribute for each, ``env_method`` calls the
vector env's method once.

Needs the ``rl`` extra (``pip install 'rollcap[rl]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.vector_core import CoreVectorEnv

try:
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor
except ImportError as err:  # pragma: no cover - the rl extra is installed in CI
    raise ImportError(f"rollcap.rollout.gym.sb3 needs Stable-Baselines3: pip install 'rollcap[rl]' ({err})") from err


def unbatched(infos: dict, i: int) -> dict[str, Any]:
    """Sub-env ``i``'s own info from a gymnasium vector info (each key where its ``_key`` mask holds for ``i``;
    nested dicts likewise); ``final_obs`` / ``final_info`` are left out (:meth:`SB3VecEnv.step_wait` reads them)."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        if isinstance(value, dict):
            nested = unbatched(value, i)
            if nested:
                out[key] = nested
        elif bool(infos.get(f"_{key}", np.ones(i + 1, bool))[i]):
            out[key] = value[i].item() if isinstance(value[i], np.generic) else value[i]
    return out


class SB3VecEnv(VecEnv):
    """An SB3 ``VecEnv`` over a rollcap vector env built with ``autoreset_mode=AutoresetMode.SAME_STEP``
    (:func:`make_sb3_vec_env` builds one); see the module docstring for what it returns.

    Args:
        venv: a :class:`~rollcap.rollout.gym.vector.ChunkVectorEnv` or
            :class:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv`; closed by :meth:`close`.
    """

    def __init__(self, venv: CoreVectorEnv):
        if not isinstance(venv, CoreVectorEnv):
            raise TypeError(
                f"venv: expected a rollcap vector env (gym.make_vec of a rollcap/ RL id), got {type(venv).__name__}"
            )
        if venv.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ConfigError(
                "autoreset_mode",
                f"SB3 resets a finished sub-env within the step: build the vector env with autoreset_mode='SameStep' "
                f"(make_sb3_vec_env does), got {venv.autoreset_mode.value!r}",
            )
        self.venv = venv
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)

    def reset(self):
        """Reset every sub-env (with the seeds :meth:`seed` set, used once, as SB3's ``DummyVecEnv``)."""
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        obs, infos = self.venv.reset(seed=seeds)
        self.reset_infos = [unbatched(infos, i) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        """One round of the batched core; see the module docstring for the infos."""
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async(actions)")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, infos = self.venv.step(actions)
        dones = terminated | truncated
        out = []
        for i in range(self.num_envs):
            info = unbatched(infos, i)
            if dones[i]:
                self.reset_infos[i] = info  # the next episode's reset info
                info = unbatched(infos["final_info"], i)
                info["terminal_observation"] = infos["final_obs"][i]
            info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            out.append(info)
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        self.venv.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        frames = self.venv.render()
        return [None] * self.num_envs if frames is None else list(frames)

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        """The vector env's attribute, once per sub-env asked (the sub-envs are its slots)."""
        return [getattr(self.venv, attr_name)] * len(list(self._get_indices(indices)))

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        """Set the vector env's attribute: it holds for every sub-env, so ``indices`` must name them all."""
        if sorted(self._get_indices(indices)) != list(range(self.num_envs)):
            raise ValueError(f"set_attr({attr_name!r}): the sub-envs are slots of one env; set it for all of them")
        setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        """Call the vector env's method once; its result for each sub-env asked."""
        result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
        return [result] * len(list(self._get_indices(indices)))

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        """No gymnasium wrapper sits on a slot: False for each."""
        return [False] * len(list(self._get_indices(indices)))


def make_sb3_vec_env(env_id: str, n_envs: int = 8, monitor: bool = True, **kw) -> VecEnv:
    """``gym.make_vec(env_id, num_envs=n_envs, autoreset_mode=SameStep, **kw)`` (a rollcap RL id: one graph at batch
    ``n_envs``) as an SB3 ``VecEnv``, under SB3's ``VecMonitor`` (episode returns and lengths for its logger) unless
    ``monitor=False``. ``kw``: the vector env's (``state_only``, ``noise_bound``, ``max_episode_steps``,
    ``subscribers``, ``config``, ``parts``, ...)."""
    import gymnasium as gym

    if "autoreset_mode" in kw and kw["autoreset_mode"] not in (AutoresetMode.SAME_STEP, "SameStep"):
        raise ConfigError("autoreset_mode", f"SB3 needs SameStep (the default here), got {kw['autoreset_mode']!r}")
    kw["autoreset_mode"] = AutoresetMode.SAME_STEP
    venv = gym.make_vec(env_id, num_envs=n_envs, **kw)
    if not isinstance(venv, CoreVectorEnv):
        venv.close()
        raise ConfigError(
            "env_id",
            f"{env_id} has no rollcap vector entry point (rollcap/ChunkPushBlock-v0, rollcap/NoiseSteerPushBlock-v0); "
            "SB3's own make_vec_env vectorizes other envs",
        )
    env = SB3VecEnv(venv)
    return VecMonitor(env) if monitor else env
