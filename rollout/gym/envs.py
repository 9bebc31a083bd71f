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
        critic's; absent without one), ``steps``, ``policy_chunk`` (with the sde sampler also
        ``flow_logp`` ``[K]``, ``flow_trace`` ``[K+1, H, A]``, ``flow_step_noise``: what the chunk's
        log-probability needs, :mod:`rollcap.policies.flow_sde`). Everything in
        ``info`` is a pure function of the seed and the actions (gymnasium's
        checker asks that); the last step's latencies are in ``env.timings``.
        ``reset`` gives ``rollcap_episode``, ``rollcap_seed`` and
        ``rollcap_index`` (see :meth:`_CoreEnv.reset`); gymnasium's
        ``RecordEpisodeStatistics`` owns the key ``episode``.
    actions: exactly the action space's shape (never reshaped) and finite,
        else ValueError saying what was expected and what came.

Registered ids (by ``import rollcap``): ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` (the built-in task, shipped policy and
critic, CPU); any env/policy pair via :func:`make_chunk_env` /
:func:`make_noise_steering_env`, or the classes directly. ``render_mode="rgb_array"``
makes ``render()`` return the image the policy sees (gymnasium's ``RecordVideo``).

Seeding follows gymnasium: ``reset(seed=s)`` starts a run whose episode ``j``
uses ``episode_seed(s, j)`` (so equal seeds give equal episodes in any
process), and the first reset without a seed draws ``s`` from entropy. Every
episode's seed is recorded with it, so a recorded episode replays whichever
way it was seeded.

Recording: an :class:`~rollcap.rollout.recording.EpisodeRecorder` among
``subscribers`` (or added to ``env.host.subscribers`` later) records every
episode that ends, a seeded reset included, under an index no env sharing
the recorder has used (nor the run directory of a resumed recorder). ``close()`` closes the host, the lanes the ``make_*`` functions
made, and calls every subscriber's ``on_run_end``.

Single-threaded, like the host.
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
from rollcap.rollout.gym.checks import (
    RENDER_MODES,
    checked_action,
    claim_index,
    closed_error,
    entropy_seed,
    fork_safe_torch,
    frame_key,
    keep_records,
    render_metadata,
    reset_stop_reason,
)
from rollcap.rollout.host import HostState, RolloutHost
from rollcap.rollout.protocols import ChunkCritic, ChunkPolicy, Subscriber
from rollcap.rollout.seeding import episode_seed

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


def gym_obs_space(space: spaces.Space, max_tokens: int = MAX_TOKENS, state_only: bool = False) -> spaces.Dict:
    """The envs' observation space: the env's, its instruction as ``instruction_tokens`` (a non-dict one under
    ``observation``); ``state_only``: the env's ``state`` alone (a non-dict one under ``observation``)."""
    if state_only:
        if isinstance(space, spaces.Dict) and "state" not in space.spaces:
            raise ValueError(f"state_only=True needs a 'state' in the env's observation; it has {sorted(space.spaces)}")
        return spaces.Dict({"state": space["state"]} if isinstance(space, spaces.Dict) else {"observation": space})
    if isinstance(space, spaces.Dict):
        keys = {k: s for k, s in space.spaces.items() if k != "instruction"}
    else:
        keys = {"observation": space}
    keys["instruction_tokens"] = spaces.Box(0, EOS, (max_tokens,), np.int64)
    return spaces.Dict(keys)


def gym_obs(obs, max_tokens: int = MAX_TOKENS, state_only: bool = False) -> dict[str, np.ndarray]:
    """An env observation as the envs return it (see :func:`gym_obs_space`)."""
    if state_only:
        return {"state": obs["state"]} if isinstance(obs, dict) else {"observation": obs}
    if isinstance(obs, dict):
        out = {k: v for k, v in obs.items() if k != "instruction"}
        out["instruction_tokens"] = instruction_tokens(obs.get("instruction", ""), max_tokens)
    else:
        out = {"observation": obs, "instruction_tokens": instruction_tokens("", max_tokens)}
    return out


class _CoreEnv(gym.Env):
    """What both envs share: the host, the observation conversion, the episode sequence, rendering, closing."""

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 1.0}

    def __init__(
        self,
        env: gym.Env,
        policy: ChunkPolicy,
        critic: ChunkCritic | None = None,
        config: HostConfig | None = None,
        subscribers: tuple[Subscriber, ...] = (),
        max_tokens: int = MAX_TOKENS,
        render_mode: str | None = None,
        state_only: bool = False,
        owns: tuple = (),
    ):
        if not isinstance(env, gym.Env):
            raise TypeError(f"env: expected a gymnasium.Env, got {type(env).__name__}")
        if (
            config is not None and config.chunking != "sync"
        ):  # step() would not see the queue's steps (run during boundary())
            raise ConfigError(
                "chunking", f"the gymnasium envs step whole chunks synchronously; got {config.chunking!r}"
            )
        self._frame = frame_key(env.observation_space, render_mode)
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
        self.owns = list(owns)
        """What :meth:`close` closes besides the host (the lanes the ``make_*_env`` functions made)."""
        self.render_mode = render_mode
        self.metadata = render_metadata(env, self.host.config.execute_steps)
        self.chunk_shape = tuple(int(n) for n in policy.chunk_shape)
        self.max_tokens = int(max_tokens)
        self.state_only = bool(state_only)
        self.observation_space = self._obs_space(env.observation_space)
        self._run_seed: int | None = None  # the last seeded reset's seed (or one drawn from entropy)
        self._episode = 0  # the next episode's number in that run: its seed is episode_seed(run seed, number)
        self._index = 0  # the next episode's index: unique for this env's life and its recorders' (their file names)
        self._chunks = 0  # steps of the running episode (a TimeLimit's count)
        self._last_obs = None  # the env's last observation (render() shows its image)
        self.timings: dict[str, float] = {}
        """The last step's boundary latencies in seconds (``policy_s``, ``critic_s``, ``boundary_s``)."""

    def _obs_space(self, space: spaces.Space) -> spaces.Dict:
        return gym_obs_space(space, self.max_tokens, self.state_only)

    def _obs(self, obs) -> dict[str, np.ndarray]:
        return gym_obs(obs, self.max_tokens, self.state_only)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """End the running episode and start the next: capsule restore, env reset from its episode seed.

        ``seed`` starts a new run: episode ``j`` after it uses ``episode_seed(seed, j)``, as ``rollcap run --seed``
        does. The first reset without a seed draws the run's seed from entropy (``np_random``), as gymnasium's envs
        do. info: ``rollcap_episode`` (``j``), ``rollcap_seed`` (the episode's seed, recorded with it) and
        ``rollcap_index`` (its index in a recording: no env sharing the recorder reuses it). A running episode
        ends with stop reason ``time_limit`` when a gymnasium ``TimeLimit`` around this env truncated it, else
        ``reset``.
        """
        if self.host.state is HostState.CLOSED:
            raise closed_error("reset()")
        super().reset(seed=seed)
        keep_records(self.host)
        if self.host.state is not HostState.RESET:
            self.host.finish(reset_stop_reason(self._chunks))
        if seed is not None:
            self._run_seed, self._episode = int(seed), 0
        elif self._run_seed is None:
            self._run_seed, self._episode = entropy_seed(self.np_random), 0
        info = {
            "rollcap_episode": self._episode,
            "rollcap_seed": episode_seed(self._run_seed, self._episode),
            "rollcap_index": claim_index(self._index, self.host.subscribers),
        }
        obs = self.host.start(info["rollcap_index"], info["rollcap_seed"])
        self._episode, self._index, self._chunks = self._episode + 1, info["rollcap_index"] + 1, 0
        if self.host.done:  # the reset itself failed: finish() raises the env's error (on_error="raise")
            self.host.finish()
        self._last_obs = obs
        return self._obs(obs), info

    def _step_chunk(self, noise: np.ndarray | None, actions: np.ndarray | None):
        host = self.host
        if host.state is not HostState.RUNNING:
            raise gym.error.ResetNeeded("step() before reset() or after the episode ended; call reset()")
        event = host.boundary(noise)  # None: an error (finish() re-raises it) or an outside stop
        steps = [] if host.done else host.execute(actions)
        self._chunks += 1
        reward = float(sum(s.reward for s in steps))
        info = {"steps": len(steps)}
        if event is not None:
            info["policy_chunk"] = event.actions
            if event.flow is not None:  # sampler sde: the chunk's log-probabilities, trace and step noise
                info.update({f"flow_{k}": v for k, v in event.flow.items()})
            if host.critic is not None:  # NaN without one: absent (NaN != NaN fails gymnasium's determinism check)
                info["value"] = event.value
            self.timings = {
                "policy_s": event.latency_policy_s,
                "critic_s": event.latency_critic_s,
                "boundary_s": event.latency_boundary_s,
            }
        obs = self._last_obs = host.obs
        terminated = truncated = False
        if host.done:
            end = host.finish()
            info["stop_reason"] = end.stop_reason
            info["is_success"] = end.success
            terminated = end.stop_reason in TERMINAL
            truncated = not terminated
        return self._obs(obs), reward, terminated, truncated, info

    def _action(self, action) -> np.ndarray:
        if self.host.state is HostState.CLOSED:
            raise closed_error("step()")
        return checked_action(action, self.action_space.shape)

    def render(self):
        """The image the policy sees now (``render_mode="rgb_array"``: the first ``image_*`` of the observation)."""
        if self._frame is None or self._last_obs is None:
            return None
        return np.array(self._last_obs[self._frame])

    def close(self):
        """Abandon a running episode (nothing recorded), close the host and what the env owns; then every
        subscriber's ``on_run_end`` (a recorder closes its files). Safe to call twice."""
        if self.host.state is not HostState.CLOSED:
            self.host.close()
            for part in self.owns:
                part.close()
            for s in self.host.subscribers:
                s.on_run_end()


class ChunkEnv(_CoreEnv):
    """One step = one chunk boundary, then the agent's ``[H, A]`` chunk executed in the env.

    The action space is the env's action bounds tiled to ``(H, A)``. The
    policy still runs at every boundary (its chunk is in ``info["policy_chunk"]``,
    for residual RL) and the critic feeds the stop predicates. See the module
    docstring for observation, reward and done conventions.
    """

    def __init__(self, env, policy, critic=None, config=None, subscribers=(), max_tokens: int = MAX_TOKENS, **kw):
        super().__init__(env, policy, critic, config, subscribers, max_tokens, **kw)
        base = env.action_space
        if not isinstance(base, spaces.Box) or base.shape != (self.chunk_shape[1],):
            raise ValueError(
                f"env action space {base} is not a Box of shape ({self.chunk_shape[1]},), the policy's action width"
            )
        h = self.chunk_shape[0]
        self.action_space = spaces.Box(np.tile(base.low, (h, 1)), np.tile(base.high, (h, 1)), dtype=np.float32)

    def step(self, action):
        """Run a boundary, then execute ``action`` (an ``[H, A]`` chunk, recorded as the agent's)."""
        return self._step_chunk(None, self._action(action))


class NoiseSteeringEnv(_CoreEnv):
    """One step = one chunk of the frozen policy, its flow noise chosen by the agent (DSRL).

    Args:
        value_in_obs: add the critic's value of the current observation as
            ``value`` (float32 ``(1,)``); needs a critic.
        noise_bound: the action space is ``[-noise_bound, noise_bound]`` per element and the agent's noise is
            clipped to it (default :data:`NOISE_BOUND`; DSRL's recipe uses 1.5).
        state_only: the agent sees the env's ``state`` alone (and ``value``): no images, no instruction (the policy
            still sees the whole observation).
        render_mode: None or ``"rgb_array"`` (``render()``: the image the policy sees).
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
        noise_bound: float = NOISE_BOUND,
        **kw,
    ):
        super().__init__(env, policy, critic, config, subscribers, max_tokens, **kw)
        if value_in_obs and critic is None:
            raise ValueError("value_in_obs=True needs a critic")
        self.noise_bound = checked_bound(noise_bound)
        self.value_in_obs = value_in_obs
        if value_in_obs:
            self.observation_space = spaces.Dict(
                {**self.observation_space.spaces, "value": spaces.Box(-1.0, 0.0, (1,), np.float32)}
            )
        self.action_space = spaces.Box(-self.noise_bound, self.noise_bound, self.chunk_shape, np.float32)

    def _obs(self, obs):
        out = super()._obs(obs)
        if self.value_in_obs:
            critic = self.host.critic
            critic.start(obs)
            out["value"] = np.clip(np.array([critic.result()], np.float32), -1.0, 0.0)
        return out

    def step(self, action):
        """Run the policy on the agent's noise (clipped to the action space) and execute its chunk."""
        return self._step_chunk(np.clip(self._action(action), -self.noise_bound, self.noise_bound), None)


def checked_bound(bound) -> float:
    """``noise_bound`` as a float in (0, :data:`NOISE_BOUND`]; ConfigError otherwise."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.floating)) or not 0 < bound <= NOISE_BOUND:
        raise ConfigError("noise_bound", f"expected a number in (0, {NOISE_BOUND}], got {bound!r}")
    return float(bound)


def _default_parts(env_kwargs: dict | None, device: str, config: dict | None):
    from rollcap.rollout.build import Parts, make_env, make_runners

    fork_safe_torch()
    parts = Parts(env_kwargs=env_kwargs, device=device)
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    return env, policy, critic, HostConfig(**(config or {}))


def lanes_of(*runners) -> list:
    """The lanes the runners were handed (a runner closes only a lane it made): closed by whoever made them."""
    return [r.lane for r in runners if r is not None and not getattr(r, "_own_lane", True)]


def owned(cls, env, policy, critic, *args, **kw):
    """``cls(env, policy, critic, *args, **kw)`` owning the runners' lanes; if it refuses its arguments, the parts
    made for it are closed before the error goes on."""
    try:
        return cls(env, policy, critic, *args, owns=lanes_of(policy, critic), **kw)
    except BaseException:
        for part in (policy, critic, env, *lanes_of(policy, critic)):
            if part is not None:
                part.close()
        raise


def make_chunk_env(env_kwargs: dict | None = None, device: str = "cpu", config: dict | None = None, **kw) -> ChunkEnv:
    """``rollcap/ChunkPushBlock-v0``: the built-in task with the shipped policy and critic (``kw``: ChunkEnv's)."""
    return owned(ChunkEnv, *_default_parts(env_kwargs, device, config), **kw)


def make_noise_steering_env(
    env_kwargs: dict | None = None, device: str = "cpu", config: dict | None = None, **kw
) -> NoiseSteeringEnv:
    """``rollcap/NoiseSteerPushBlock-v0``: the built-in task, the shipped policy steered through its noise
    (``kw``: NoiseSteeringEnv's: ``value_in_obs``, ``noise_bound``, ``state_only``, ``render_mode``, ...)."""
    return owned(NoiseSteeringEnv, *_default_parts(env_kwargs, device, config), **kw)
