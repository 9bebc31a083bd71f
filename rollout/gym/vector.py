"""Gymnasium vector envs over the batched episode core: N sub-envs, one policy graph and one critic graph at batch N.

- :class:`ChunkVectorEnv`: N :class:`~rollcap.rollout.gym.envs.ChunkEnv` s in
  one (an action is a chunk per sub-env).
- :class:`NoiseSteeringVectorEnv`: N :class:`~rollcap.rollout.gym.envs.NoiseSteeringEnv` s
  in one (an action is the flow noise per sub-env).

Each sub-env is a slot of a :class:`~rollcap.rollout.batch.BatchedCore`: every
``step`` launches every sub-env's boundary, replays the batch once, and
executes the sub-envs' chunks on the core's thread pool. Observation, reward,
done and info conventions are the single envs' (see
:mod:`rollcap.rollout.gym.envs`), batched as gymnasium batches them, and a
sub-env's trajectory is the one the single env gives for the same seed and
actions (bit for bit where the policy's output does not steer it: a
ChunkVectorEnv without a critic stop; the policy's own rows are batch-N bits).

Autoreset follows gymnasium 1.x (``metadata["autoreset_mode"]``): ``NEXT_STEP``
(the default, as ``SyncVectorEnv``: the step after an episode ends resets that
sub-env, ignoring its action, with reward 0) or ``SAME_STEP`` (the ended
sub-env is reset in the same step; ``info["final_obs"]`` / ``info["final_info"]``
hold the last observation and info). ``reset(seed=s)`` seeds sub-env ``i``
with ``s + i`` (a list: one seed each); its episode ``j`` then uses the run
seed ``s + i``'s derived seed ``j``, as :class:`ChunkEnv` does.

Single-threaded, like the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import build
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.envs import MAX_TOKENS, NOISE_BOUND, TERMINAL, gym_obs, gym_obs_space
from rollcap.rollout.host import HostState
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec

MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


class _CoreVectorEnv(VectorEnv):
    """What both vector envs share: the batched core, observation batching, seeding and autoreset."""

    def __init__(
        self,
        envs: Sequence[gym.Env],
        policy,
        critic=None,
        config: HostConfig | None = None,
        max_tokens: int = MAX_TOKENS,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        workers: int | None = None,
    ):
        envs = list(envs)
        if not envs or not all(isinstance(e, gym.Env) for e in envs):
            raise TypeError(f"envs: expected a non-empty list of gymnasium.Env, got {[type(e).__name__ for e in envs]}")
        mode = AutoresetMode(autoreset_mode) if isinstance(autoreset_mode, str) else autoreset_mode
        if mode not in MODES:
            raise ConfigError("autoreset_mode", f"expected one of {[m.value for m in MODES]}, got {autoreset_mode!r}")
        self.core = BatchedCore(envs, policy, critic, config, records=False, on_error="raise", workers=workers)
        self.num_envs = len(envs)
        self.chunk_shape = tuple(int(n) for n in self.core.hosts[0].policy.chunk_shape)
        self.max_tokens = int(max_tokens)
        self.metadata = {"autoreset_mode": mode, "render_modes": []}
        self.autoreset_mode = mode
        self.single_observation_space = gym_obs_space(envs[0].observation_space, self.max_tokens)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = self._single_action_space(envs[0])
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._run_seeds = [0] * self.num_envs
        self._episodes = [0] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, bool)
        self.core.open_pool()

    def _single_action_space(self, env: gym.Env) -> spaces.Box:  # pragma: no cover - interface
        raise NotImplementedError

    def _split(self, actions) -> tuple[list, list]:  # pragma: no cover - interface
        """Per sub-env (noise, actions) for the core's round."""
        raise NotImplementedError

    # -- gymnasium -------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """End every running episode (stop reason ``reset``) and start the next one in each sub-env."""
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: expected {self.num_envs} seeds, got {len(seeds)}")
        if seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seeds[0])
        obs, infos = [], {}
        for i, s in enumerate(seeds):
            o, info = self._reset_one(i, s)
            obs.append(o)
            infos = self._add_info(infos, info, i)
        self._autoreset[:] = False
        return self._batch(obs), infos

    def step(self, actions):
        """One chunk in every sub-env (see the module docstring for autoreset)."""
        hosts = self.core.hosts
        if any(h.state is not HostState.RUNNING for i, h in enumerate(hosts) if not self._autoreset[i]):
            raise gym.error.ResetNeeded("step() before reset(); call reset()")
        noise, chunks = self._split(actions)
        stepping = [not r for r in self._autoreset]
        results = self.core.round(noise, chunks, stepping)
        obs, infos = [None] * self.num_envs, {}
        rewards = np.zeros(self.num_envs, np.float64)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        for i, h in enumerate(hosts):
            if not stepping[i]:  # NEXT_STEP: the episode ended last step; this step resets it
                obs[i], info = self._reset_one(i, None)
                infos = self._add_info(infos, info, i)
                continue
            event, steps = results[i]
            rewards[i] = float(sum(s.reward for s in steps))
            info: dict[str, Any] = {"steps": len(steps)}
            if event is not None:
                info.update(value=event.value, policy_chunk=event.actions)
            obs[i] = gym_obs(h.obs, self.max_tokens)
            if h.done:
                end = h.finish()
                info.update(stop_reason=end.stop_reason, is_success=end.success)
                terminated[i] = end.stop_reason in TERMINAL
                truncated[i] = not terminated[i]
                if self.autoreset_mode is AutoresetMode.SAME_STEP:
                    infos = self._add_info(infos, {"final_obs": obs[i], "final_info": info}, i)
                    obs[i], info = self._reset_one(i, None)
            infos = self._add_info(infos, info, i)
        self._autoreset = (terminated | truncated) & (self.autoreset_mode is AutoresetMode.NEXT_STEP)
        return self._batch(obs), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs) -> None:
        self.core.close()

    # -- private ---------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None) -> tuple[dict[str, np.ndarray], dict]:
        host = self.core.hosts[i]
        if seed is not None:
            self._run_seeds[i], self._episodes[i] = int(seed), 0
        if host.state is not HostState.RESET:
            host.finish("reset")
        j = self._episodes[i]
        obs = host.start(j, episode_seed(self._run_seeds[i], j))
        self._episodes[i] += 1
        if host.done:  # the reset itself failed: finish() raises the env's error (on_error="raise")
            host.finish()
        return gym_obs(obs, self.max_tokens), {"episode": j}

    def _batch(self, obs: list[dict[str, np.ndarray]]):
        return concatenate(
            self.single_observation_space, obs, create_empty_array(self.single_observation_space, self.num_envs)
        )


class ChunkVectorEnv(_CoreVectorEnv):
    """N chunk envs on one batched core: an action is ``[N, H, A]``, each sub-env's chunk executed after its boundary.

    Args:
        envs: N gymnasium envs (one per sub-env).
        policy / critic: runners captured at batch N, or G graphs at N/G each (:func:`rollcap.rollout.build.build`).
        config: the hosts' config (stop rules, seed).
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default) or ``SAME_STEP``.
        workers: threads stepping the sub-envs (0: this thread).
    """

    def _single_action_space(self, env: gym.Env) -> spaces.Box:
        base = env.action_space
        if not isinstance(base, spaces.Box) or base.shape != (self.chunk_shape[1],):
            raise ValueError(
                f"env action space {base} is not a Box of shape ({self.chunk_shape[1]},), the policy's action width"
            )
        h = self.chunk_shape[0]
        return spaces.Box(np.tile(base.low, (h, 1)), np.tile(base.high, (h, 1)), dtype=np.float32)

    def _split(self, actions):
        a = np.asarray(actions, dtype=np.float32).reshape(self.num_envs, *self.chunk_shape)
        return None, list(a)


class NoiseSteeringVectorEnv(_CoreVectorEnv):
    """N noise-steering envs on one batched core: an action is the flow noise ``[N, H, A]`` (clipped to ±NOISE_BOUND)."""

    def _single_action_space(self, env: gym.Env) -> spaces.Box:
        return spaces.Box(-NOISE_BOUND, NOISE_BOUND, self.chunk_shape, np.float32)

    def _split(self, actions):
        a = np.clip(
            np.asarray(actions, dtype=np.float32).reshape(self.num_envs, *self.chunk_shape), -NOISE_BOUND, NOISE_BOUND
        )
        return list(a), None


def _default_parts(num_envs: int, env_kwargs: dict | None, device: str, threads: int, graphs: int, parts=None):
    if graphs < 1 or num_envs % graphs:
        raise ConfigError("graphs", f"expected an integer >= 1 that divides num_envs ({num_envs}), got {graphs!r}")
    if parts is None:
        parts = Parts(env_kwargs=env_kwargs, device=device, threads=threads)
    elif env_kwargs is not None:
        raise ConfigError("env_kwargs", "give the env's kwargs in parts (Parts(env_kwargs=...)), not beside it")
    built = build(Spec(parts, run=RunConfig(envs=num_envs, graphs=graphs)), check_env=False)
    return built.envs, built.policy, built.critic


def make_chunk_vector_env(
    num_envs: int = 8,
    env_kwargs: dict | None = None,
    device: str = "cpu",
    config: dict | None = None,
    threads: int = 1,
    graphs: int = 1,
    parts=None,
    **kw,
) -> ChunkVectorEnv:
    """``gym.make_vec("rollcap/ChunkPushBlock-v0", num_envs)``: the built-in task, shipped policy and critic at batch
    ``num_envs`` (``graphs``: split over that many graphs, as ``rollcap run --graphs``; ``parts``: another env and
    checkpoints, a :class:`~rollcap.rollout.build.Parts`, instead of ``env_kwargs`` / ``device`` / ``threads``)."""
    return ChunkVectorEnv(
        *_default_parts(num_envs, env_kwargs, device, threads, graphs, parts), HostConfig(**(config or {})), **kw
    )


def make_noise_steering_vector_env(
    num_envs: int = 8,
    env_kwargs: dict | None = None,
    device: str = "cpu",
    config: dict | None = None,
    threads: int = 1,
    graphs: int = 1,
    parts=None,
    **kw,
) -> NoiseSteeringVectorEnv:
    """``gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs)``: the shipped policy steered through its noise at batch
    ``num_envs`` (``graphs``: split over that many graphs, as ``rollcap run --graphs``; ``parts``: another env and
    checkpoints, e.g. a MetaWorld task with the MT10 policy, instead of ``env_kwargs`` / ``device`` / ``threads``)."""
    return NoiseSteeringVectorEnv(
        *_default_parts(num_envs, env_kwargs, device, threads, graphs, parts), HostConfig(**(config or {})), **kw
    )
