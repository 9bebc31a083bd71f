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

With the sde sampler (``Parts(sampler="sde")``) each sub-env's info also holds its
chunk's ``flow_logp`` / ``flow_trace`` / ``flow_step_noise`` (what a learner's
log-probability ratio needs), and ``load_weights`` puts a learner's new
weights into the batched graph in place (no rebuild, no recapture; ends the
running episodes, so ``reset()`` next): ``examples/flow_rl_gym.py``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rollcap.rollout.build import build
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.checks import fork_safe_torch
from rollcap.rollout.gym.envs import (
    NOISE_BOUND,
    checked_bound,
    checked_residual,
    chunk_action_space,
    lanes_of,
    policy_chunk_space,
)
from rollcap.rollout.gym.vector_core import CoreVectorEnv
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.spec import Parts, RunConfig, Spec


class ChunkVectorEnv(CoreVectorEnv):
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


class NoiseSteeringVectorEnv(CoreVectorEnv):
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
    run = RunConfig(envs=num_envs, graphs=graphs, env_workers=0)  # the vector env steps its envs itself
    built = build(Spec(parts, run=run), check_env=False)
    return built.envs, built.policies, built.critics or None


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
    checkpoints, a :class:`~rollcap.rollout.spec.Parts`, instead of ``env_kwargs`` / ``device`` / ``threads``;
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
