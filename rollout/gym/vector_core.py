"""What both vector envs are (:class:`CoreVectorEnv`): a :class:`~rollcap.rollout.batch.BatchedCore` behind
gymnasium's ``VectorEnv``, with its autoreset modes (:func:`autoreset_mode_of`), reset masks (:func:`reset_mask_of`),
seeding per sub-env, recording, rendering and branching (``boundary`` / ``restart``).

A step is the subclass's ``_advance`` (one batched round; or, for a chunk env, the chunks and then the next
boundaries) and then, per sub-env, its end and its autoreset. Each sub-env's info is built in one place,
:meth:`CoreVectorEnv._chunk_info`, from its boundary's chunk event: what a sub-env reports of its chunk goes there.
The envs themselves and their conventions are :mod:`rollcap.rollout.gym.vector`'s.
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
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.checks import (
    CALLER_RESET,
    TIME_LIMIT,
    checked_action,
    claim_index,
    closed_error,
    entropy_seed,
    frame_key,
    render_metadata,
)
from rollcap.rollout.gym.core import MAX_TOKENS, TERMINAL, gym_obs, gym_obs_space
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.resume import Resume
from rollcap.rollout.seeding import episode_seed

MODES = {m.value: m for m in AutoresetMode}
"""gymnasium's autoreset modes by their spelling (``"NextStep"``, ``"SameStep"``, ``"Disabled"``): all three are taken."""


def autoreset_mode_of(mode) -> AutoresetMode:
    """``mode`` as an :class:`~gymnasium.vector.AutoresetMode` (the enum, or its value as gymnasium spells it: its own
    ``SyncVectorEnv`` and ``make_vec`` take no other spelling); ConfigError naming the choices otherwise."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str) and mode in MODES:
        return MODES[mode]
    choices = ", ".join(f"{v!r} (AutoresetMode.{m.name})" for v, m in MODES.items())
    raise ConfigError("autoreset_mode", f"expected one of {choices}, got {mode!r}")


def reset_mask_of(options: dict | None, n: int) -> np.ndarray | None:
    """``options["reset_mask"]`` checked as ``SyncVectorEnv`` checks it (a bool array of shape ``(n,)``, some True),
    or None when there is none; TypeError / ValueError in one line otherwise."""
    if not options or "reset_mask" not in options:
        return None
    mask = options["reset_mask"]
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
        what = f"dtype {mask.dtype}" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise TypeError(f"options['reset_mask']: expected a numpy bool array of shape ({n},), got {what}")
    if mask.shape != (n,):
        raise ValueError(f"options['reset_mask']: expected shape ({n},), got {mask.shape}")
    if not mask.any():
        raise ValueError(f"options['reset_mask']: expected at least one True (a sub-env to reset), got {mask.tolist()}")
    return mask


class CoreVectorEnv(VectorEnv):
    """What both vector envs share: the batched core, observation batching, seeding, autoreset, recording, rendering.

    A step is :meth:`_advance` (the subclass's: one batched round, or a chunk and then the next boundary) and then,
    per sub-env, its end (:meth:`_end`) and its autoreset; each sub-env's info is built in one place
    (:meth:`_chunk_info`, from its boundary's chunk event).
    """

    LOOKAHEAD = False
    """True when a step ends with the next boundary (ChunkVectorEnv): each sub-env holds the plan for its observation."""

    def __init__(  # noqa: PLR0913 - gymnasium's vector-env keyword options
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
        mode = autoreset_mode_of(autoreset_mode)
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
        self.single_observation_space = self._obs_space(envs[0].observation_space)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.single_action_space = self._single_action_space(envs[0])
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._run_seeds: list[int | None] = [None] * self.num_envs  # per sub-env, as a single env's
        self._episodes = [0] * self.num_envs
        self._chunks = [0] * self.num_envs
        self._values: list[list[float]] = [[] for _ in range(self.num_envs)]  # per sub-env: its episode's critic values
        self._last_obs: list = [None] * self.num_envs
        self._events: list = [None] * self.num_envs  # per sub-env: its last boundary's chunk event
        self._index = 0  # the next episode's index, unique across the sub-envs (a shared recorder's file names)
        self._ended = np.zeros(self.num_envs, bool)  # ended at the last step, not reset yet (NextStep / Disabled)
        self.core.open_pool()

    def _single_action_space(self, env: gym.Env) -> spaces.Box:  # pragma: no cover - interface
        raise NotImplementedError

    def _obs_space(self, space: spaces.Space) -> spaces.Dict:
        return gym_obs_space(space, self.max_tokens, self.state_only)

    def _observe(self, i: int) -> dict[str, np.ndarray]:
        """Sub-env ``i``'s observation as the agent gets it (its env's last one)."""
        return gym_obs(self._last_obs[i], self.max_tokens, self.state_only)

    def _advance(
        self, actions: np.ndarray, stepping: list[int], fresh: list[int]
    ) -> dict[int, tuple[float, dict]]:  # pragma: no cover - interface
        """The subclass's part of a step: the ``stepping`` sub-envs' chunks from the checked ``[N, H, A]`` batch (and,
        with :data:`LOOKAHEAD`, their next boundaries and the first of the episodes just started in ``fresh``, in one
        replay); per stepping sub-env its reward and info."""
        raise NotImplementedError

    def _plan(self, slots: list[int]) -> None:
        """The first boundary of the episodes just started in ``slots`` (with :data:`LOOKAHEAD`; else nothing)."""

    def _chunk_info(self, i: int, event) -> dict[str, Any]:
        """What sub-env ``i``'s info says of its boundary's chunk event (recorded for :meth:`boundary`'s values)."""
        self._events[i] = event
        if event is None:
            return {}
        self._values[i].append(float(event.value))
        info: dict[str, Any] = {}
        if event.flow is not None:  # sampler sde: the chunk's log-probabilities, trace and step noise
            info.update({f"flow_{k}": v for k, v in event.flow.items()})
        if self.core.critic is not None:  # NaN without one: absent (NaN != NaN fails gymnasium's checks)
            info["value"] = event.value
        return info

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
        self._ended[:] = False  # nothing to autoreset: reset() starts every sub-env again
        for runner in {id(r.runner): r.runner for r in self.core.policy_rows}.values():
            digest = runner.load_weights(weights, digest)
        return digest

    # -- gymnasium -------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """End every running episode and start the next one in each sub-env (as a single env's ``reset``).

        ``seed`` s: sub-env ``i`` starts the run ``s + i`` (a list: one seed each, None for "go on"); a sub-env
        never seeded draws its run's seed from entropy, so unseeded sub-envs differ. ``options["reset_mask"]`` (a
        bool array, as ``SyncVectorEnv`` takes it): only those sub-envs are reset (the others go on; infos only for
        the reset ones), the way to reset ended sub-envs under ``AutoresetMode.DISABLED``.
        """
        if self.closed:
            raise closed_error("reset()")
        mask = reset_mask_of(options, self.num_envs)
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: expected {self.num_envs} seeds, got {len(seeds)}")
        slots = list(range(self.num_envs)) if mask is None else [int(i) for i in np.flatnonzero(mask)]
        if seed is not None:
            first = seeds[slots[0]]
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(first)
        infos: dict = {}
        for i in slots:
            infos = self._add_info(infos, self._reset_one(i, seeds[i]), i)
            self._ended[i] = False
        self._plan(slots)
        return self._batch([self._observe(i) for i in range(self.num_envs)]), infos

    def step(self, actions):
        """One chunk in every sub-env (see the module docstring for autoreset)."""
        if self.closed:
            raise closed_error("step()")
        live = (HostState.RUNNING, HostState.STOP_INFER)  # STOP_INFER: stopped at its first boundary, reported now
        if any(h.state not in live for i, h in enumerate(self.core.hosts) if not self._ended[i]):
            raise gym.error.ResetNeeded("step() before reset(); call reset()")
        if self.autoreset_mode is AutoresetMode.DISABLED and self._ended.any():
            ended = np.flatnonzero(self._ended).tolist()
            raise gym.error.ResetNeeded(
                f"step(): sub-envs {ended} ended and autoreset_mode is Disabled: reset them first, "
                f"reset(options={{'reset_mask': mask}}) with mask a bool array True at {ended}"
            )
        actions = checked_action(actions, self.action_space.shape, "actions")
        stepping = [i for i in range(self.num_envs) if not self._ended[i]]
        fresh = [i for i in range(self.num_envs) if self._ended[i]]  # NextStep: the episode ended last step
        infos: dict = {}
        for i in fresh:  # reset first, so their first boundary shares the step's replay (LOOKAHEAD)
            infos = self._add_info(infos, self._reset_one(i, None), i)
        results = self._advance(actions, stepping, fresh)
        rewards = np.zeros(self.num_envs, np.float64)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        restarted = []
        for i in stepping:
            rewards[i], info = results[i]
            end = self._end(i, info)
            if end is not None:
                terminated[i], truncated[i] = end
                if self.autoreset_mode is AutoresetMode.SAME_STEP:
                    infos = self._add_info(infos, {"final_obs": self._observe(i), "final_info": info}, i)
                    info = self._reset_one(i, None)
                    restarted.append(i)
            infos = self._add_info(infos, info, i)
        self._plan(restarted)
        self._ended = (terminated | truncated) & (self.autoreset_mode is not AutoresetMode.SAME_STEP)
        return self._batch([self._observe(i) for i in range(self.num_envs)]), rewards, terminated, truncated, infos

    def _end(self, i: int, info: dict) -> tuple[bool, bool] | None:
        """Sub-env ``i`` after its chunk: its episode finished when it stopped or reached ``max_episode_steps`` (stop
        reason and success into ``info``), and (terminated, truncated); None while it runs on."""
        host = self.core.hosts[i]
        self._chunks[i] += 1
        self._last_obs[i] = host.obs
        if not host.done and (self.max_episode_steps is None or self._chunks[i] < self.max_episode_steps):
            return None
        end = host.finish(TIME_LIMIT)  # the reason counts only for an episode still running
        info.update(stop_reason=end.stop_reason, is_success=end.success)
        terminated = end.stop_reason in TERMINAL
        return terminated, not terminated

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
        ep, chunk, step = host._ep, host.book.chunk, host.book.step
        values = list(self._values[i])  # the critic's values at the earlier chunks: its stop predicates count them
        if self.LOOKAHEAD and ep.pending is not None:  # the plan for this observation is decided, not executed
            chunk, values = chunk - 1, values[:-1]
        origin = {"parent": "live", "episode": ep.index, "chunk": chunk, "step": step, "noise": "caller"}
        copy = lambda v: v.copy() if isinstance(v, np.ndarray) else v  # noqa: E731 (the instruction is a str)
        obs = {k: copy(v) for k, v in host.obs.items()} if isinstance(host.obs, dict) else copy(host.obs)
        state = {k: np.array(v) for k, v in host.state_env.get_state().items()}
        if len(values) != chunk:  # pragma: no cover - a boundary that ran no chunk
            raise RuntimeError(f"boundary(): sub-env {i} kept {len(values)} critic values for {chunk} chunks")
        origin["prior_values"] = list(values)
        return Resume(state, obs, chunk, step, origin, prior_values=tuple(values))

    def restart(self, i: int, at: Resume) -> tuple[dict[str, np.ndarray], dict]:
        """End sub-env ``i``'s episode (stop reason ``caller_reset``) and start its next one at ``at`` (a
        :meth:`boundary` of any sub-env): reset from the next episode seed, then the boundary's exact state. Returns
        the sub-env's observation (unbatched, as gymnasium's) and reset info (``rollcap_origin``: ``at.origin``)."""
        self._live(i, "restart()", running=False)
        if not isinstance(at, Resume):
            raise TypeError(f"at: expected a Resume (from boundary()), got {type(at).__name__}")
        info = self._reset_one(i, None, at)
        self._chunks[i], self._ended[i] = at.chunk, False
        self._plan([i])
        return self._observe(i), {**info, "rollcap_origin": dict(at.origin)}

    def _live(self, i: int, what: str, running: bool = True):
        if self.closed:
            raise closed_error(what)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_envs:
            raise ValueError(f"{what}: sub-env index must be an integer in [0, {self.num_envs}), got {i!r}")
        host = self.core.hosts[int(i)]
        if running and (host.state is not HostState.RUNNING or self._ended[i]):
            raise gym.error.ResetNeeded(f"{what}: sub-env {i} has no running episode; reset() or step() first")
        return host

    def render(self) -> tuple | None:
        """Each sub-env's image, as the policy sees it (``render_mode="rgb_array"``)."""
        if self._frame is None or any(o is None for o in self._last_obs):
            return None
        return tuple(np.array(o[self._frame]) for o in self._last_obs)

    def close_extras(self, **kwargs) -> None:
        """Abandon running episodes (nothing recorded), close the envs and what the env owns; then every
        subscriber's ``on_run_end`` (a recorder stays open: whoever opened it closes it)."""
        self.core.close()
        for part in self.owns:
            part.close()
        for s in self.core.subscribers:
            s.on_run_end()

    # -- private ---------------------------------------------------------------
    def _reset_one(self, i: int, seed: int | None, at: Resume | None = None) -> dict:
        """End sub-env ``i``'s episode if it runs and start its next (at ``at``); its reset info."""
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
        self._values[i], self._events[i] = ([] if at is None else list(at.prior_values)), None
        if host.done:  # the reset itself failed: finish() raises the env's error (on_error="raise")
            host.finish()
        self._last_obs[i] = obs
        return info

    def _batch(self, obs: list[dict[str, np.ndarray]]):
        return concatenate(
            self.single_observation_space, obs, create_empty_array(self.single_observation_space, self.num_envs)
        )
