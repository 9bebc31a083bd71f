"""Gymnasium envs over the episode core, for RL training loops.

- :class:`ChunkEnv`: the action is an action chunk ``[H, A]``; one ``step``
  runs one chunk boundary (policy and critic on their lanes, stop predicates)
  and executes the agent's chunk in the env.
- :class:`NoiseSteeringEnv`: the action is the flow noise ``[H, A]`` fed to
  the frozen policy for the chunk (DSRL: RL steers a frozen VLA through its
  latent noise); the policy's chunk is executed.

Both drive a :class:`~rollcap.rollout.host.RolloutHost` through ``start`` /
``boundary`` / ``execute`` / ``finish``: capsule reset, stop predicates,
interventions and (with a recorder among ``subscribers``) recording work as in
``rollcap run``, and a recorded episode replays exactly. No boundary logic
lives here.

Conventions:
    observation: the env's observation with the instruction as byte tokens
        (``instruction_tokens``, int64, PAD-padded) instead of text, so every
        key is a Box (SB3 and vector envs take it); NoiseSteeringEnv can add
        the critic's ``value`` (float32 ``(1,)``).
    reward: the sum of the env's rewards over the steps the chunk executed,
        undiscounted inside the chunk (``info["steps"]`` says how many, for
        per-step discounting: ``gamma ** steps`` between chunks).
    terminated: the task ended (success, or the env's own termination).
    truncated: the episode was cut (env time limit, chunk or time limit,
        critic stop, an outside stop event).
    info: ``stop_reason`` and ``is_success`` (at the end), ``value`` (the
        critic's, NaN without one), ``steps``, ``policy_chunk``. Everything in
        ``info`` is a pure function of the seed and the actions (gymnasium's
        checker asks that); the last step's latencies are in ``env.timings``.

Registered ids (by ``import rollcap``): ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` (the built-in task, shipped policy and
critic, CPU); any env/policy pair via :func:`make_chunk_env` /
:func:`make_noise_steering_env`, or the classes directly.

Single-threaded, like the host. ``reset(seed=s)`` starts a new sequence of
episode seeds (episode ``i`` after it uses the run's derived seed ``i``), so
equal seeds give equal episodes in any process.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rollcap.kernels.errors import BadInput
from rollcap.policies.observation import EOS, tokenize
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import HostState, RolloutHost
from rollcap.rollout.protocols import ChunkCritic, ChunkPolicy, Subscriber

TERMINAL = ("success", "terminated")
"""Stop reasons that are the task's own end (gymnasium's ``terminated``); every other stop truncates."""
NOISE_BOUND = 4.0
"""NoiseSteeringEnv's action is a Box in [-NOISE_BOUND, NOISE_BOUND] (standard-normal noise lies within it but for 6e-5)."""
MAX_TOKENS = 64


def instruction_tokens(text: str, max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """The models' byte tokenizer (:func:`rollcap.policies.observation.tokenize`): UTF-8 bytes framed by
    BOS/EOS, PAD-padded to ``max_tokens`` (int64); a longer instruction is refused, never truncated."""
    try:
        return tokenize(str(text), max_tokens)
    except BadInput as err:
        raise ValueError(f"instruction does not fit {max_tokens} tokens ({err})") from err


def gym_obs_space(space: spaces.Space, max_tokens: int = MAX_TOKENS) -> spaces.Dict:
    """The envs' observation space: the env's, its instruction as ``instruction_tokens`` (a non-dict one under ``observation``)."""
    if isinstance(space, spaces.Dict):
        keys = {k: s for k, s in space.spaces.items() if k != "instruction"}
    else:
        keys = {"observation": space}
    keys["instruction_tokens"] = spaces.Box(0, EOS, (max_tokens,), np.int64)
    return spaces.Dict(keys)


def gym_obs(obs, max_tokens: int = MAX_TOKENS) -> dict[str, np.ndarray]:
    """An env observation as the envs return it (see :func:`gym_obs_space`)."""
    if isinstance(obs, dict):
        out = {k: v for k, v in obs.items() if k != "instruction"}
        out["instruction_tokens"] = instruction_tokens(obs.get("instruction", ""), max_tokens)
    else:
        out = {"observation": obs, "instruction_tokens": instruction_tokens("", max_tokens)}
    return out


class _CoreEnv(gym.Env):
    """What both envs share: the host, the observation conversion, the episode sequence."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        env: gym.Env,
        policy: ChunkPolicy,
        critic: ChunkCritic | None = None,
        config: HostConfig | None = None,
        subscribers: tuple[Subscriber, ...] = (),
        max_tokens: int = MAX_TOKENS,
    ):
        if not isinstance(env, gym.Env):
            raise TypeError(f"env: expected a gymnasium.Env, got {type(env).__name__}")
        if (
            config is not None and config.chunking != "sync"
        ):  # step() would not see the queue's steps (run during boundary())
            raise ConfigError(
                "chunking", f"the gymnasium envs step whole chunks synchronously; got {config.chunking!r}"
            )
        self.env = env
        self.host = RolloutHost(
            env,
            policy,
            critic,
            config,
            subscribers,
            records=any(getattr(s, "wants_records", False) for s in subscribers),
            on_error="raise",
        )
        self.chunk_shape = tuple(int(n) for n in policy.chunk_shape)
        self.max_tokens = int(max_tokens)
        self.observation_space = self._obs_space(env.observation_space)
        self._run_seed, self._episode = 0, 0
        self.timings: dict[str, float] = {}
        """The last step's boundary latencies in seconds (``policy_s``, ``critic_s``, ``boundary_s``)."""

    def _obs_space(self, space: spaces.Space) -> spaces.Dict:
        return gym_obs_space(space, self.max_tokens)

    def _obs(self, obs) -> dict[str, np.ndarray]:
        return gym_obs(obs, self.max_tokens)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """End the running episode (stop reason ``reset``) and start the next: capsule restore, env reset from its seed."""
        super().reset(seed=seed)
        if seed is not None:
            self._run_seed, self._episode = int(seed), 0
        if self.host.state is not HostState.RESET:
            self.host.finish("reset")
        from rollcap.rollout.seeding import episode_seed

        obs = self.host.start(self._episode, episode_seed(self._run_seed, self._episode))
        self._episode += 1
        return self._obs(obs), {"episode": self._episode - 1}

    def _step_chunk(self, noise: np.ndarray | None, actions: np.ndarray | None):
        host = self.host
        if host.state is not HostState.RUNNING:
            raise gym.error.ResetNeeded("step() before reset() or after the episode ended; call reset()")
        event = host.boundary(noise)  # None: an error (finish() re-raises it) or an outside stop
        steps = [] if host.done else host.execute(actions)
        reward = float(sum(s.reward for s in steps))
        info = {"steps": len(steps)}
        if event is not None:
            info.update(value=event.value, policy_chunk=event.actions)
            self.timings = {
                "policy_s": event.latency_policy_s,
                "critic_s": event.latency_critic_s,
                "boundary_s": event.latency_boundary_s,
            }
        obs = host.obs
        terminated = truncated = False
        if host.done:
            end = host.finish()
            info["stop_reason"] = end.stop_reason
            info["is_success"] = end.success
            terminated = end.stop_reason in TERMINAL
            truncated = not terminated
        return self._obs(obs), reward, terminated, truncated, info

    def close(self):
        if self.host.state is not HostState.CLOSED:
            self.host.close()


class ChunkEnv(_CoreEnv):
    """One step = one chunk boundary, then the agent's ``[H, A]`` chunk executed in the env.

    The action space is the env's action bounds tiled to ``(H, A)``. The
    policy still runs at every boundary (its chunk is in ``info["policy_chunk"]``,
    for residual RL) and the critic feeds the stop predicates. See the module
    docstring for observation, reward and done conventions.
    """

    def __init__(self, env, policy, critic=None, config=None, subscribers=(), max_tokens: int = MAX_TOKENS):
        super().__init__(env, policy, critic, config, subscribers, max_tokens)
        base = env.action_space
        if not isinstance(base, spaces.Box) or base.shape != (self.chunk_shape[1],):
            raise ValueError(
                f"env action space {base} is not a Box of shape ({self.chunk_shape[1]},), the policy's action width"
            )
        h = self.chunk_shape[0]
        self.action_space = spaces.Box(np.tile(base.low, (h, 1)), np.tile(base.high, (h, 1)), dtype=np.float32)

    def step(self, action):
        """Run a boundary, then execute ``action`` (an ``[H, A]`` chunk, recorded as the agent's)."""
        return self._step_chunk(None, np.asarray(action, dtype=np.float32).reshape(self.chunk_shape))


class NoiseSteeringEnv(_CoreEnv):
    """One step = one chunk of the frozen policy, its flow noise chosen by the agent (DSRL).

    Args:
        value_in_obs: add the critic's value of the current observation as
            ``value`` (float32 ``(1,)``); needs a critic.
    """

    def __init__(
        self,
        env,
        policy,
        critic=None,
        config=None,
        subscribers=(),
        max_tokens: int = MAX_TOKENS,
        value_in_obs: bool = False,
    ):
        super().__init__(env, policy, critic, config, subscribers, max_tokens)
        if value_in_obs and critic is None:
            raise ValueError("value_in_obs=True needs a critic")
        self.value_in_obs = value_in_obs
        if value_in_obs:
            self.observation_space = spaces.Dict(
                {**self.observation_space.spaces, "value": spaces.Box(-1.0, 0.0, (1,), np.float32)}
            )
        self.action_space = spaces.Box(-NOISE_BOUND, NOISE_BOUND, self.chunk_shape, np.float32)

    def _obs(self, obs):
        out = super()._obs(obs)
        if self.value_in_obs:
            critic = self.host.critic
            critic.start(obs)
            out["value"] = np.clip(np.array([critic.result()], np.float32), -1.0, 0.0)
        return out

    def step(self, action):
        """Run the policy on the agent's noise (clipped to the action space) and execute its chunk."""
        noise = np.clip(np.asarray(action, dtype=np.float32).reshape(self.chunk_shape), -NOISE_BOUND, NOISE_BOUND)
        return self._step_chunk(noise, None)


def _default_parts(env_kwargs: dict | None, device: str, config: dict | None):
    from rollcap.rollout.build import Parts, make_env, make_runners

    parts = Parts(env_kwargs=env_kwargs, device=device)
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    return env, policy, critic, HostConfig(**(config or {}))


def make_chunk_env(env_kwargs: dict | None = None, device: str = "cpu", config: dict | None = None, **kw) -> ChunkEnv:
    """``rollcap/ChunkPushBlock-v0``: the built-in task with the shipped policy and critic."""
    return ChunkEnv(*_default_parts(env_kwargs, device, config), **kw)


def make_noise_steering_env(
    env_kwargs: dict | None = None, device: str = "cpu", config: dict | None = None, **kw
) -> NoiseSteeringEnv:
    """``rollcap/NoiseSteerPushBlock-v0``: the built-in task, the shipped policy steered through its noise."""
    return NoiseSteeringEnv(*_default_parts(env_kwargs, device, config), **kw)
