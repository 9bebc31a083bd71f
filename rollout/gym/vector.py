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
sub-env, ignoring its action, with reward 0), ``SAME_STEP`` (the ended
sub-env is reset in the same step; ``info["final_obs"]`` / ``info["final_info"]``
hold the last observation and info) or ``DISABLED`` (an ended sub-env waits for
``reset(options={"reset_mask": mask})``; a step before that is refused, naming
it). ``reset_mask`` resets only the masked sub-envs, in every mode, as
``SyncVectorEnv`` does. The mode is the enum or its value (``"NextStep"``,
``"SameStep"``, ``"Disabled"``, the only spellings gymnasium takes); anything
else is one ConfigError naming the choices. ``info["is_success"]`` is there at
every step (False until an episode ends in success), ``stop_reason`` at the
end, as the single envs'. ChunkVectorEnv runs every sub-env's next boundary
after its chunk (one replay for the batch), so each observation holds the
policy's chunk for it (``policy_chunk``). Seeding is a single env's per sub-env:
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
subscriber's ``on_run_end`` (a recorder stays open: whoever opened it closes it).

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
from rollcap.rollout.gym.envs import (
    MAX_TOKENS,
    NOISE_BOUND,
    TERMINAL,
    checked_bound,
    checked_residual,
    chunk_action_space,
    gym_obs,
    gym_obs_space,
    lanes_of,
    policy_chunk_space,
)
from rollcap.rollout.host import HostState
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.resume import Resume
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec

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


class _CoreVectorEnv(VectorEnv):
    """What both vector envs share: the batched core, observation batching, seeding, autoreset, recording, rendering.

    A step is :meth:`_advance` (the subclass's: one batched round, or a chunk and then the next boundary) and then,
    per sub-env, its end (:meth:`_end`) and its autoreset; each sub-env's info is built in one place
    (:meth:`_chunk_info`, from its boundary's chunk event).
    """

    LOOKAHEAD = False
    """True when a step ends with the next boundary (ChunkVectorEnv): each sub-env holds the plan for its observation."""

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
        if self.core.critic is not None:  # NaN without one: absent (NaN != NaN fails gymnasium's checks)
            info["value"] = event.value
        return info

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
        ep, (chunk, step) = host._ep, (int(c) for c in host.book.counters[1:3])
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


class ChunkVectorEnv(_CoreVectorEnv):
    """N chunk envs on one batched core: an action is ``[N, H, A]``, each sub-env's chunk (its first ``execute_steps``
    rows) executed, then every sub-env's next boundary in one replay, so each observation holds the policy's chunk for
    it (``policy_chunk``, as :class:`~rollcap.rollout.gym.envs.ChunkEnv`'s; batch-N bits).

    Args:
        envs: N gymnasium envs (one per sub-env).
        policy / critic: runners captured at batch N, or G graphs at N/G each (:func:`rollcap.rollout.build.build`).
        config: the hosts' config (stop rules, seed, ``execute_steps``).
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (or their values,
            ``"NextStep"``, ``"SameStep"``, ``"Disabled"``).
        workers: threads stepping the sub-envs (0: this thread).
        subscribers: shared by every sub-env (a recorder records every sub-env's episodes, indices unique).
        render_mode: None or ``"rgb_array"`` (``render()``: each sub-env's image, as the policy sees it).
        max_episode_steps: truncate an episode after that many steps (chunks), stop reason ``time_limit``
            (``gym.make_vec(id, max_episode_steps=K)``; gymnasium has no vector ``TimeLimit``).
        state_only: the agent sees the env's ``state`` alone (and ``policy_chunk``).
        owns: closed with the env.
        residual: as :class:`~rollcap.rollout.gym.envs.ChunkEnv`'s (an action in ``[-1, 1]``, executed as the
            policy's chunk plus ``residual`` times it).
    """

    LOOKAHEAD = True

    def __init__(self, *args, residual: float | None = None, **kw):
        self.residual = checked_residual(residual)
        super().__init__(*args, **kw)

    def _single_action_space(self, env: gym.Env) -> spaces.Box:
        return chunk_action_space(env.action_space, self.chunk_shape, self.residual)

    def _obs_space(self, space):
        out = super()._obs_space(space)
        return spaces.Dict({**out.spaces, "policy_chunk": policy_chunk_space(self.chunk_shape)})

    def _observe(self, i):
        out = super()._observe(i)
        out["policy_chunk"] = self._plan_of(i)
        return out

    def _plan_of(self, i: int) -> np.ndarray:
        event = self._events[i]
        return np.zeros(self.chunk_shape, np.float32) if event is None else np.array(event.actions)

    def _advance(self, actions, stepping, fresh):
        hosts, e = self.core.hosts, self.core.config.execute_steps
        if self.residual is not None:
            scale = np.float32(self.residual)
            actions = [self._plan_of(i) + scale * np.clip(a, -1.0, 1.0) for i, a in enumerate(actions)]
        steps = self.core.execute(
            [a[:e] for a in actions], [i for i in stepping if hosts[i].state is HostState.RUNNING]
        )
        # the next boundary of every episode that runs on (a cut one too: its last observation's plan), and the first
        # of the episodes started this step, in one replay; an episode that ended in its env has none (zeros)
        planned = [i for i in stepping if hosts[i].state is HostState.RUNNING]
        events = self.core.boundaries(active=[i in planned or i in fresh for i in range(self.num_envs)])
        self._first(fresh, events)
        out = {}
        for i in stepping:
            info = {"steps": len(steps.get(i, [])), "is_success": False}
            out[i] = (float(sum(s.reward for s in steps.get(i, []))), {**info, **self._chunk_info(i, events[i])})
        return out

    def _plan(self, slots):
        if slots:
            self._first(slots, self.core.boundaries(active=[i in slots for i in range(self.num_envs)]))

    def _first(self, slots, events) -> None:
        """The episodes just started in ``slots`` took their first boundary (``events``); one that failed raises."""
        for i in slots:
            self._chunk_info(i, events[i])
            if events[i] is None and self.core.hosts[i].done:  # finish() raises its error (on_error="raise")
                self.core.hosts[i].finish()


class NoiseSteeringVectorEnv(_CoreVectorEnv):
    """N noise-steering envs on one batched core: an action is the flow noise ``[N, H, A]``, clipped to
    ±``noise_bound`` (default :data:`~rollcap.rollout.gym.envs.NOISE_BOUND`); the other arguments are
    :class:`ChunkVectorEnv`'s. ``info["policy_chunk"]``: each sub-env's chunk, the one executed."""

    def __init__(self, *args, noise_bound: float = NOISE_BOUND, **kw):
        self.noise_bound = checked_bound(noise_bound)
        super().__init__(*args, **kw)

    def _single_action_space(self, env: gym.Env) -> spaces.Box:
        return spaces.Box(-self.noise_bound, self.noise_bound, self.chunk_shape, np.float32)

    def _advance(self, actions, stepping, fresh):
        noise = list(np.clip(actions, -self.noise_bound, self.noise_bound))
        results = self.core.round(noise, None, [i in stepping for i in range(self.num_envs)])
        out = {}
        for i in stepping:
            event, steps = results[i]
            info = {"steps": len(steps), "is_success": False, **self._chunk_info(i, event)}
            if event is not None:
                info["policy_chunk"] = event.actions
            out[i] = (float(sum(s.reward for s in steps)), info)
        return out


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
