"""Gymnasium envs over the episode core, for RL training loops.

- :class:`ChunkEnv`: the action is an action chunk ``[H, A]``; one ``step``
  executes the agent's chunk in the env (its first ``execute_steps`` rows), then
  runs the next chunk boundary (policy and critic on their lanes, stop
  predicates): the observation holds the policy's chunk for it
  (``policy_chunk``), for residual RL.
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
    info: ``is_success`` at every step (False until an episode ends in
        success, as gymnasium-robotics reports it, so SB3's and other loggers
        count every episode), ``stop_reason`` at the end (also when a gymnasium
        ``TimeLimit`` cuts the episode: the env ends it in that step, stop reason
        ``time_limit``), ``value`` (the critic's; absent without one), ``steps``,
        NoiseSteeringEnv's ``policy_chunk`` (the chunk executed), and with the sde
        sampler ``flow_logp`` ``[K]``, ``flow_trace`` ``[K+1, H, A]`` and
        ``flow_step_noise`` (what the chunk's log-probability needs,
        :mod:`rollcap.policies.flow_sde`). Everything in
        ``info`` is a pure function of the seed and the actions (gymnasium's
        checker asks that); the last step's latencies are in ``env.timings``.
        ``reset`` gives ``rollcap_episode``, ``rollcap_seed`` and
        ``rollcap_index`` (see :meth:`~rollcap.rollout.gym.core.CoreEnv.reset`); gymnasium's
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
made, and calls every subscriber's ``on_run_end``; a recorder stays open (whoever opened it closes it), so a train env
and an eval env can share one. A recorder copied into another process (``AsyncVectorEnv``'s workers) refuses at the
first reset, in one line.

Single-threaded, like the host.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.checks import fork_safe_torch, time_limit_cuts
from rollcap.rollout.gym.core import MAX_TOKENS, CoreEnv
from rollcap.rollout.lifecycle import HostState

NOISE_BOUND = 4.0
"""NoiseSteeringEnv's action is a Box in [-NOISE_BOUND, NOISE_BOUND] (standard-normal noise lies within it but for 6e-5)."""


class ChunkEnv(CoreEnv):
    """One step = the agent's ``[H, A]`` chunk executed in the env, then the next chunk boundary.

    The action space is the env's action bounds tiled to ``(H, A)``; like the
    policy's own chunk, its first ``execute_steps`` rows are executed (the
    config's, default the policy's own: 4 of the shipped policy's 8), the rest
    is the plan's tail. The policy still runs at every boundary, and its chunk
    for the *current* observation is in the observation as ``policy_chunk``
    (float32 ``(H, A)``), computed before the agent acts: reset runs the first
    boundary, and each step runs the next one after the chunk. So residual RL
    acts ``obs["policy_chunk"] + residual``, and a zero residual is the frozen
    policy, episode for episode (the host sees the same boundaries and chunks as
    ``rollcap run``). The critic feeds the stop predicates; a boundary that stops
    the episode ends the step that led to it (a boundary runs after the last
    chunk of an episode that a time limit cuts too, as ``rollcap run
    --max-chunks`` records one: the cut observation's plan is there to bootstrap
    from; an episode the env itself ended shows zeros). ``info["value"]`` is the
    critic's value of the returned observation. See the module docstring for observation,
    reward and done conventions.

    Args:
        residual: None (the action is the chunk), or a scale ``s > 0``: the action is a residual in
            ``[-1, 1]^(H, A)`` (clipped to it) and the env executes ``obs["policy_chunk"] + s * action`` (that sum
            is not clipped: the env treats it as it treats the policy's own chunk), so an agent whose action starts at zero starts as the
            frozen policy (SB3's SAC and PPO start near zero).
    """

    def __init__(
        self,
        env,
        policy,
        critic=None,
        config=None,
        subscribers=(),
        max_tokens: int = MAX_TOKENS,
        residual: float | None = None,
        **kw,
    ):
        residual = checked_residual(residual)  # before anything is built
        super().__init__(env, policy, critic, config, subscribers, max_tokens, **kw)
        self.residual = residual
        self.action_space = chunk_action_space(env.action_space, self.chunk_shape, self.residual)
        self.execute_steps = int(self.host.config.execute_steps)
        """Rows of the agent's chunk executed each step (the host config's, default the policy's own)."""
        self.observation_space = spaces.Dict(
            {**self.observation_space.spaces, "policy_chunk": policy_chunk_space(self.chunk_shape)}
        )

    def _obs(self, obs):
        out = super()._obs(obs)
        out["policy_chunk"] = self._obs_plan()
        return out

    def _obs_plan(self) -> np.ndarray:
        """The policy's chunk for the current observation (zeros where the episode ended in the env)."""
        event = self._event
        return np.zeros(self.chunk_shape, np.float32) if event is None else np.array(event.actions)

    def _started(self) -> None:
        self._boundary(None, {})
        if self.host.done and self._event is None:  # the first boundary failed: finish() raises its error
            self.host.finish()

    def step(self, action):
        """Execute ``action`` (an ``[H, A]`` chunk, its first ``execute_steps`` rows, recorded as the agent's), then run
        the next boundary: the returned observation holds the policy's chunk for it."""
        chunk = self._action(action)
        if self.residual is not None:
            chunk = self._obs_plan() + np.float32(self.residual) * np.clip(chunk, -1.0, 1.0)
        host = self._running()
        self._event = None  # an episode that ends in the env has no next boundary: its last observation's plan is zeros
        reward, info = self._execute(chunk[: self.execute_steps])
        if not host.done:  # also when a TimeLimit cuts now: the cut observation's plan is there to bootstrap from
            self._boundary(None, info)
        return self._end_step(reward, info, time_limit_cuts())


def checked_residual(scale) -> float | None:
    """``residual`` as None or a float > 0; ConfigError otherwise."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not 0 < scale < np.inf:
        raise ConfigError("residual", f"expected None or a number > 0 (the residual's scale), got {scale!r}")
    return float(scale)


def chunk_action_space(base: spaces.Space, chunk_shape: tuple[int, int], residual: float | None) -> spaces.Box:
    """A chunk env's action space: the env's action box tiled to ``(H, A)``, or ``[-1, 1]^(H, A)`` for a residual;
    ValueError for an env whose actions are not a Box of the policy's width."""
    h, a = chunk_shape
    if not isinstance(base, spaces.Box) or base.shape != (a,):
        raise ValueError(f"env action space {base} is not a Box of shape ({a},), the policy's action width")
    if residual is not None:
        return spaces.Box(-1.0, 1.0, (h, a), np.float32)
    return spaces.Box(np.tile(base.low, (h, 1)), np.tile(base.high, (h, 1)), dtype=np.float32)


def policy_chunk_space(chunk_shape: tuple[int, int]) -> spaces.Box:
    """``policy_chunk``'s space: the policy's raw chunk, float32 ``(H, A)``, unbounded (it may leave the action box)."""
    return spaces.Box(-np.inf, np.inf, tuple(chunk_shape), np.float32)


class NoiseSteeringEnv(CoreEnv):
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
        """Run the policy on the agent's noise (clipped to the action space) and execute its chunk; ``info["policy_chunk"]``
        is that chunk (the one executed)."""
        noise = np.clip(self._action(action), -self.noise_bound, self.noise_bound)
        host = self._running()
        info: dict = {}
        self._event = None
        if host.state is HostState.RUNNING:
            self._boundary(noise, info)
        reward, more = self._execute(None)
        if self._event is not None:
            more["policy_chunk"] = self._event.actions
        return self._end_step(reward, {**more, **info}, time_limit_cuts())


def checked_bound(bound) -> float:
    """``noise_bound`` as a float in (0, :data:`NOISE_BOUND`]; ConfigError otherwise."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.floating)) or not 0 < bound <= NOISE_BOUND:
        raise ConfigError("noise_bound", f"expected a number in (0, {NOISE_BOUND}], got {bound!r}")
    return float(bound)


def _default_parts(env_kwargs: dict | None, device: str, config: dict | None):
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners

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
