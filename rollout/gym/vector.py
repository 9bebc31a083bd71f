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
hold the last observation and info). Seeding is a single env's per sub-env:
``reset(seed=s)`` seeds sub-env ``i`` with ``s + i`` (a list: one seed each),
its episode ``j`` then uses ``episode_seed(s + i, j)``; a sub-env never seeded
draws its run seed from entropy, so unseeded sub-envs differ. Reset infos carry
``rollcap_episode``, ``rollcap_seed`` and ``rollcap_index`` (the key ``episode``
is gymnasium's ``RecordEpisodeStatistics``'s).

A recorder among ``subscribers`` records every sub-env's episodes, under
indices unique across the sub-envs. ``max_episode_steps`` (what
``gym.make_vec(id, max_episode_steps=K)`` passes; gymnasium has no vector
``TimeLimit``) truncates an episode after K steps with stop reason
``time_limit``. ``render_mode="rgb_array"``: ``render()`` returns each
sub-env's image as the policy sees it (gymnasium's vector ``RecordVideo``).
Actions must have exactly the batch's shape and be finite. Branching:
``boundary(i)`` is sub-env ``i``'s chunk boundary now (its exact env state, as
a :class:`~rollcap.rollout.resume.Resume`), and ``restart(j, at)`` starts
sub-env ``j``'s next episode there, so several sub-envs can play different
chunks from one state (DSRL's branch data); needs an env with exact state.
``close()`` closes
the envs, the runners and lanes the ``make_*`` functions made, and calls every
subscriber's ``on_run_end``.

With the sde sampler (``Parts(sampler="sde")``) each sub-env's info also holds its
chunk's ``flow_logp`` / ``flow_trace`` / ``flow_step_noise`` (what a learner's
log-probability ratio needs), and :meth:`load_weights` puts a learner's new
weights into the batched graph in place (no rebuild, no recapture; ends the
running episodes, so ``reset()`` next): ``examples/flow_rl_gym.py``.

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
from rollcap.rollout.gym.checks import (
    CALLER_RESET,
    TIME_LIMIT,
    checked_action,
    claim_index,
    closed_error,
    entropy_seed,
    fork_safe_torch,
    frame_key,
    render_metadata,
)
from rollcap.rollout.gym.envs import MAX_TOKENS, NOISE_BOUND, TERMINAL, checked_bound, gym_obs, gym_obs_space, lanes_of
from rollcap.rollout.host import HostState
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.resume import Resume
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec

MODES = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)


class _CoreVectorEnv(VectorEnv):
    """What both vector envs share: the batched core, observation batching, seeding, autoreset, recording, rendering."""

    def __init__(
        self,
        envs: Sequence[gym.Env],
        policy,
        critic=None,
        config: HostConfig | None = None,
        max_tokens: int = MAX_TOKENS,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        workers: int | None = None,
        subscribers: Sequence[Subscriber] = (),
        render_mode: str | None = None,
        max_episode_steps: int | None = None,
        state_only: bool = False,
        owns: Sequence = (),
    ):
        envs = list(envs)
        if not envs or not all(isinstance(e, gym.Env) for e in envs):
            raise TypeError(f"envs: expected a non-empty list of gymnasium.Env, got {[type(e).__name__ for e in envs]}")
        mode = AutoresetMode(autoreset_mode) if isinstance(autoreset_mode, str) else autoreset_mode
        if mode not in MODES:
            raise ConfigError("autoreset_mode", f"expected one of {[m.value for m in MODES]}, got {autoreset_mode!r}")
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1
        ):
            raise ConfigError("max_episode_steps", f"expected an integer >= 1 or None, got {max_episode_steps!r}")
        self._frame = frame_key(envs[0].observation_space, render_mode)
        subscribers = list(subscribers)
        self.core = BatchedCore(
            envs,
            policy,
            critic,
            config,
            subscribers,
            records=any(getattr(s, "wants_records", False) for s in subscribers),
            on_error="raise",
            workers=workers,
        )
        self.owns = list(owns)
        """What :meth:`close` closes besides the core (the lanes and runners ``make_*_vector_env`` made)."""
        self.num_envs = len(envs)
        self.chunk_shape = tuple(int(n) for n in self.core.hosts[0].policy.chunk_shape)
        self.max_tokens = int(max_tokens)
        self.state_only = bool(state_only)
        self.max_episode_steps = max_episode_steps
        self.render_mode = render_mode
        self.metadata = {"autoreset_mode": mode, **render_metadata(envs[0], self.core.config.execute_steps)}
        self.autoreset_mode = mode
        self.single_observation_space = gym_obs_space(envs[0].observation_space, self.max_tokens, self.state_only)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = self._single_action_space(envs[0])
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._run_seeds: list[int | None] = [None] * self.num_envs  # per sub-env, as a single env's
        self._episodes = [0] * self.num_envs
        self._chunks = [0] * self.num_envs
        self._values: list[list[float]] = [[] for _ in range(self.num_envs)]  # per sub-env: its episode's critic values
        self._last_obs: list = [None] * self.num_envs
        self._index = 0  # the next episode's index, unique across the sub-envs (a shared recorder's file names)
        self._autoreset = np.zeros(self.num_envs, bool)
        self.core.open_pool()

    def _single_action_space(self, env: gym.Env) -> spaces.Box:  # pragma: no cover - interface
        raise NotImplementedError

    def _split(self, actions: np.ndarray) -> tuple[list | None, list | None]:  # pragma: no cover - interface
        """Per sub-env (noise, actions) for the core's round, from the checked ``[N, H, A]`` batch."""
        raise NotImplementedError

    # -- gymnasium -------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """End every running episode and start the next one in each sub-env (as a single env's ``reset``).

        ``seed`` s: sub-env ``i`` starts the run ``s + i`` (a list: one seed each, None for "go on"); a sub-env
        never seeded draws its run's seed from entropy, so unseeded sub-envs differ.
        """
        if self.closed:
            raise closed_error("reset()")
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
        if self.closed:
            raise closed_error("step()")
        hosts = self.core.hosts
        if any(h.state is not HostState.RUNNING for i, h in enumerate(hosts) if not self._autoreset[i]):
            raise gym.error.ResetNeeded("step() before reset(); call reset()")
        noise, chunks = self._split(checked_action(actions, self.action_space.shape, "actions"))
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
            self._chunks[i] += 1
            rewards[i] = float(sum(s.reward for s in steps))
            info: dict[str, Any] = {"steps": len(steps)}
            if event is not None:
                self._values[i].append(float(event.value))
                info["policy_chunk"] = event.actions
                if event.flow is not None:  # sampler sde: the chunk's log-probabilities, trace and step noise
                    info.update({f"flow_{k}": v for k, v in event.flow.items()})
                if self.core.critic is not None:  # NaN without one: absent (NaN != NaN fails gymnasium's checks)
                    info["value"] = event.value
            self._last_obs[i] = h.obs
            obs[i] = gym_obs(h.obs, self.max_tokens, self.state_only)
            if h.done or (self.max_episode_steps is not None and self._chunks[i] >= self.max_episode_steps):
                end = h.finish(TIME_LIMIT)  # the reason counts only for an episode still running
                info.update(stop_reason=end.stop_reason, is_success=end.success)
                terminated[i] = end.stop_reason in TERMINAL
                truncated[i] = not terminated[i]
                if self.autoreset_mode is AutoresetMode.SAME_STEP:
                    infos = self._add_info(infos, {"final_obs": obs[i], "final_info": info}, i)
                    obs[i], info = self._reset_one(i, None)
            infos = self._add_info(infos, info, i)
        self._autoreset = (terminated | truncated) & (self.autoreset_mode is AutoresetMode.NEXT_STEP)
        return self._batch(obs), rewards, terminated, truncated, infos

    # -- new weights, in place ---------------------------------------------------------
    def load_weights(self, weights, digest: str | None = None) -> str:
        """New policy weights (a state dict of the policy's model) into the batched graph(s) in place: nothing is
        rebuilt or recaptured (:meth:`~rollcap.kernels.runner.GraphRunner.load_weights`). An episode runs with one
        set of weights, the one its record names, so every running episode is ended first (stop reason
        ``caller_reset``): call :meth:`reset` next. Returns the weights' digest."""
        if self.closed:
            raise closed_error("load_weights()")
        for h in self.core.hosts:
            if h.state is not HostState.RESET:
                h.finish(CALLER_RESET)
        self._autoreset[:] = False
        for runner in {id(r.runner): r.runner for r in self.core.policy_rows}.values():
            digest = runner.load_weights(weights, digest)
        return digest

    # -- branching: start a sub-env's episode at another's boundary ---------------
    def boundary(self, i: int) -> Resume:
        """Sub-env ``i``'s chunk boundary now (after the last ``step``): its env's exact state, its observation and its
        chunk and step counts, as a :class:`~rollcap.rollout.resume.Resume` that :meth:`restart` starts any sub-env at.

        Raises:
            ConfigError: the env has no exact state.
        """
        host = self._live(i, "boundary()")
        if host.state_env is None:
            raise ConfigError("env_id", f"{host.env_id} has no exact state; boundary() needs one")
        ep, (chunk, step) = host._ep, (int(c) for c in host.book.counters[1:3])
        origin = {"parent": "live", "episode": ep.index, "chunk": chunk, "step": step, "noise": "caller"}
        copy = lambda v: v.copy() if isinstance(v, np.ndarray) else v  # noqa: E731 (the instruction is a str)
        obs = {k: copy(v) for k, v in host.obs.items()} if isinstance(host.obs, dict) else copy(host.obs)
        state = {k: np.array(v) for k, v in host.state_env.get_state().items()}
        values = tuple(self._values[i])  # the critic's values at the earlier chunks: its stop predicates count them
        if len(values) != chunk:  # pragma: no cover - a boundary that ran no chunk
            raise RuntimeError(f"boundary(): sub-env {i} kept {len(values)} critic values for {chunk} chunks")
        origin["prior_values"] = list(values)
        return Resume(state, obs, chunk, step, origin, prior_values=values)

    def restart(self, i: int, at: Resume) -> tuple[dict[str, np.ndarray], dict]:
        """End sub-env ``i``'s episode (stop reason ``caller_reset``) and start its next one at ``at`` (a
        :meth:`boundary` of any sub-env): reset from the next episode seed, then the boundary's exact state. Returns
        the sub-env's observation (unbatched, as gymnasium's) and reset info (``rollcap_origin``: ``at.origin``)."""
        self._live(i, "restart()", running=False)
        if not isinstance(at, Resume):
            raise TypeError(f"at: expected a Resume (from boundary()), got {type(at).__name__}")
        obs, info = self._reset_one(i, None, at)
        self._chunks[i], self._autoreset[i] = at.chunk, False
        return obs, {**info, "rollcap_origin": dict(at.origin)}

    def _live(self, i: int, what: str, running: bool = True):
        if self.closed:
            raise closed_error(what)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs:
            raise ValueError(f"{what}: sub-env index must be an integer in [0, {self.num_envs}), got {i!r}")
        host = self.core.hosts[int(i)]
        if running and (host.state is not HostState.RUNNING or self._autoreset[i]):
            raise gym.error.ResetNeeded(f"{what}: sub-env {i} has no running episode; reset() or step() first")
        return host

    def render(self) -> tuple | None:
        """Each sub-env's image, as the policy sees it (``render_mode="rgb_array"``)."""
        if self._frame is None or any(o is None for o in self._last_obs):
            return None
        return tuple(np.array(o[self._frame]) for o in self._last_obs)

    def close_extras(self, **kwargs) -> None:
        """Abandon running episodes (nothing recorded), close the envs and what the env owns; then every
        subscriber's ``on_run_end`` (a recorder closes its files)."""
        self.core.close()
        for part in self.owns:
            part.close()
        for s in self.core.subscribers:
            s.on_run_end()

    # -- private ---------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None, at: Resume | None = None) -> tuple[dict[str, np.ndarray], dict]:
        host = self.core.hosts[i]
        if host.state is not HostState.RESET:
            host.finish(CALLER_RESET)
        if seed is not None:
            self._run_seeds[i], self._episodes[i] = int(seed), 0
        elif self._run_seeds[i] is None:
            self._run_seeds[i], self._episodes[i] = entropy_seed(self.np_random), 0
        j, index = self._episodes[i], claim_index(self._index, self.core.subscribers)
        info = {"rollcap_episode": j, "rollcap_seed": episode_seed(self._run_seeds[i], j), "rollcap_index": index}
        obs = host.start(index, info["rollcap_seed"], at)
        self._episodes[i], self._index, self._chunks[i] = j + 1, index + 1, 0
        self._values[i] = [] if at is None else list(at.prior_values)
        if host.done:  # the reset itself failed: finish() raises the env's error (on_error="raise")
            host.finish()
        self._last_obs[i] = obs
        return gym_obs(obs, self.max_tokens, self.state_only), info

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
        subscribers: shared by every sub-env (a recorder records every sub-env's episodes, indices unique).
        render_mode: None or ``"rgb_array"`` (``render()``: each sub-env's image, as the policy sees it).
        max_episode_steps: truncate an episode after that many steps (chunks), stop reason ``time_limit``
            (``gym.make_vec(id, max_episode_steps=K)``; gymnasium has no vector ``TimeLimit``).
        state_only: the agent sees the env's ``state`` alone.
        owns: closed with the env.
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
        return None, list(actions)


class NoiseSteeringVectorEnv(_CoreVectorEnv):
    """N noise-steering envs on one batched core: an action is the flow noise ``[N, H, A]``, clipped to
    ±``noise_bound`` (default :data:`~rollcap.rollout.gym.envs.NOISE_BOUND`); the other arguments are
    :class:`ChunkVectorEnv`'s."""

    def __init__(self, *args, noise_bound: float = NOISE_BOUND, **kw):
        self.noise_bound = checked_bound(noise_bound)
        super().__init__(*args, **kw)

    def _single_action_space(self, env: gym.Env) -> spaces.Box:
        return spaces.Box(-self.noise_bound, self.noise_bound, self.chunk_shape, np.float32)

    def _split(self, actions):
        return list(np.clip(actions, -self.noise_bound, self.noise_bound)), None


def _default_parts(num_envs: int, env_kwargs: dict | None, device: str, threads: int, graphs: int, parts=None):
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError("num_envs", f"expected an integer >= 1, got {num_envs!r}")
    if graphs < 1 or num_envs % graphs:
        raise ConfigError("graphs", f"expected an integer >= 1 that divides num_envs ({num_envs}), got {graphs!r}")
    if parts is None:
        parts = Parts(env_kwargs=env_kwargs, device=device, threads=threads)
    elif env_kwargs is not None:
        raise ConfigError("env_kwargs", "give the env's kwargs in parts (Parts(env_kwargs=...)), not beside it")
    fork_safe_torch()
    built = build(Spec(parts, run=RunConfig(envs=num_envs, graphs=graphs)), check_env=False)
    return built.envs, built.policy, built.critic


def _owned(cls, envs, policy, critic, config: dict | None, kw: dict):
    """``cls(envs, policy, critic, HostConfig(**config), **kw)`` owning the batched runners and their lanes (the core
    closes neither); if it refuses its arguments, everything made for it is closed before the error goes on."""
    runners = [r for r in (*_listed(policy), *_listed(critic)) if r is not None]
    owns = [*runners, *lanes_of(*runners)]
    try:
        return cls(envs, policy, critic, HostConfig(**(config or {})), owns=owns, **kw)
    except BaseException:
        for part in (*envs, *owns):
            part.close()
        raise


def _listed(runner) -> list:
    return list(runner) if isinstance(runner, (list, tuple)) else [runner]


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
    checkpoints, a :class:`~rollcap.rollout.build.Parts`, instead of ``env_kwargs`` / ``device`` / ``threads``;
    ``kw``: :class:`ChunkVectorEnv`'s: ``subscribers``, ``render_mode``, ``max_episode_steps``, ...)."""
    return _owned(ChunkVectorEnv, *_default_parts(num_envs, env_kwargs, device, threads, graphs, parts), config, kw)


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
    checkpoints, e.g. a MetaWorld task with the MT10 policy, instead of ``env_kwargs`` / ``device`` / ``threads``;
    ``kw``: :class:`NoiseSteeringVectorEnv`'s: ``noise_bound``, ``state_only``, ``subscribers``, ...)."""
    return _owned(
        NoiseSteeringVectorEnv, *_default_parts(num_envs, env_kwargs, device, threads, graphs, parts), config, kw
    )
