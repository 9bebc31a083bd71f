"""What both single gymnasium envs are (:class:`CoreEnv`): a host driven through ``start`` / ``boundary`` / ``execute``
/ ``finish``, the observation as the agent gets it (:func:`gym_obs`: the instruction as byte tokens), the episode
sequence and its seeds, rendering and closing.

The envs themselves and their conventions (observation, reward, done, info, seeding, recording) are
:mod:`rollcap.rollout.gym.envs`'s; the vector envs' core is :mod:`rollcap.rollout.gym.vector_core`.
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
    TIME_LIMIT,
    checked_action,
    claim_index,
    closed_error,
    entropy_seed,
    frame_key,
    keep_records,
    render_metadata,
    reset_stop_reason,
)
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import ChunkCritic, ChunkPolicy, Subscriber
from rollcap.rollout.seeding import episode_seed

TERMINAL = ("success", "terminated")
"""Stop reasons that are the task's own end (gymnasium's ``terminated``); every other stop truncates."""
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


class CoreEnv(gym.Env):
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
        self._event = None  # the last boundary's chunk event (ChunkEnv: the plan for the current observation)
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
        self._started()
        self._last_obs = obs
        return self._obs(obs), info

    def _started(self) -> None:
        """After an episode's start, before its first observation goes out (ChunkEnv runs its first boundary)."""

    def _running(self) -> RolloutHost:
        """The host, with an episode this env has not yet ended; ResetNeeded otherwise. The episode may have stopped at
        a boundary already (ChunkEnv's first, at reset): then this step runs nothing and reports the stop."""
        if self.host.state not in (HostState.RUNNING, HostState.STOP_INFER):
            raise gym.error.ResetNeeded("step() before reset() or after the episode ended; call reset()")
        return self.host

    def _boundary(self, noise: np.ndarray | None, info: dict) -> None:
        """One chunk boundary (the policy's chunk for the current observation); its value and timings into ``info``."""
        event = self.host.boundary(noise)  # None: an error (finish() re-raises it) or an outside stop
        self._event = event
        if event is None:
            return
        if event.flow is not None:  # sampler sde: the chunk's log-probabilities, trace and step noise
            info.update({f"flow_{k}": v for k, v in event.flow.items()})
        if self.host.critic is not None:  # NaN without one: absent (NaN != NaN fails gymnasium's determinism check)
            info["value"] = event.value
        self.timings = {
            "policy_s": event.latency_policy_s,
            "critic_s": event.latency_critic_s,
            "boundary_s": event.latency_boundary_s,
        }

    def _execute(self, actions: np.ndarray | None) -> tuple[float, dict]:
        """The last boundary's chunk in the env (``actions``: the agent's, else the policy's); the reward and info."""
        steps = self.host.execute(actions) if self.host.state is HostState.RUNNING else []
        self._chunks += 1
        return float(sum(s.reward for s in steps)), {"steps": len(steps), "is_success": False}

    def _end_step(self, reward: float, info: dict, cut: bool):
        """The step's result; an episode that stopped (or that a gymnasium ``TimeLimit`` cuts now: ``cut``) is finished
        here, so ``stop_reason`` and ``is_success`` are in this step's info."""
        host = self.host
        obs = self._last_obs = host.obs
        terminated = truncated = False
        if host.done or cut:
            end = host.finish(TIME_LIMIT)  # the reason counts only for an episode still running
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
        subscriber's ``on_run_end`` (a recorder stays open: whoever opened it closes it). Safe to call twice."""
        if self.host.state is not HostState.CLOSED:
            self.host.close()
            for part in self.owns:
                part.close()
            for s in self.host.subscribers:
                s.on_run_end()
