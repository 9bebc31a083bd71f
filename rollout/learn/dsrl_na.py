"""DSRL on the batched vector env: train a noise agent (:mod:`~rollcap.rollout.learn.noise_agent`), then score it
against the frozen policy on held-out episodes, paired.

- :data:`TASKS`, the agent's view and the held-out side (:func:`evaluate`, :func:`baseline`) live in
  :mod:`~rollcap.rollout.learn.dsrl_eval` and are re-exported here.
- :func:`train`: N sub-envs of :class:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv` (one policy graph at
  batch N) feed a replay buffer; after ``init_steps`` transitions of the policy's own noise (standard normal) the
  actor's sampled noise steers them; every vector step does ``critic_steps`` critic, ``distill_steps`` noise-critic
  (NA) and ``actor_steps`` actor updates. Stops at a wall-clock or transition budget; logs a learning curve. Every
  ``heldin_every`` transitions (and at 0 and at the end) it scores the agent on the held-in stream, paired against
  zero noise (:mod:`~rollcap.rollout.learn.dsrl_heldin`), and ends with the best agent by that score (``keep_best``).

Reward: ``success_reward`` on the chunk that succeeds (success ends the episode), plus ``env_reward_scale`` x the
env's own reward, minus ``chunk_penalty`` a chunk. An episode's time limit ends it too (no bootstrap past it: the
held-out score is success within the limit).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rollcap.rollout.learn.dsrl_eval import (
    TASKS,
    Task,
    _task_code,
    features,
    obs_keys,
    viewed,
)
from rollcap.rollout.learn.dsrl_branch import Branches
from rollcap.rollout.learn.dsrl_heldin import (
    MAX_ENVS,
    MAX_HELDIN,
    MAX_SEED,
    TRAIN_SEED_BASE,
    HeldIn,
    KeepBest,
    heldin_seeds,
    kept_line,
    line,
    weights,
)
from rollcap.rollout.learn.noise_agent import AgentConfig, NoiseAgent, ReplayBuffer


@dataclass(frozen=True)
class TrainConfig:
    """The loop around the agent."""

    task: str = "peg-insert-side"
    seed: int = 0
    minutes: float = 15.0
    """Wall-clock budget of training."""
    max_transitions: int = 10_000_000
    num_envs: int = 8
    """Sub-envs on the one batched graph."""
    init_steps: int = 1500
    """Transitions of the policy's own noise before the actor steers [1,501 rollout steps]."""
    critic_steps: int = 4
    """Critic updates per vector step (of ``num_envs`` transitions) [20 per step of 4 envs]."""
    distill_steps: int = 2
    """NA: noise-critic updates per vector step [10]."""
    actor_steps: int = 1
    """Actor updates per vector step."""
    buffer: int = 300_000
    success_reward: float = 1.0
    env_reward_scale: float = 0.0
    chunk_penalty: float = 0.0
    threads: int = 1
    """Intra-op threads of the updates and of the policy's lane."""
    log_every_s: float = 30.0
    heldin_every: int = 10_000
    """Score the agent on the held-in stream every this many transitions (and at 0 and at the end); 0: never, no
    keep-best [DSRL robomimic: eval_interval 3000 steps]."""
    heldin_episodes: int = 32
    """Held-in episodes per checkpoint, the same ones each time, paired against zero noise."""
    heldin_envs: int = 16
    """Sub-envs of the held-in vector env (its own policy graph at this batch)."""
    keep_best: bool = True
    """End with the best agent by held-in success (a copy of its weights), not the last one."""
    view: str = "state"
    """What the agent sees: ``state`` or ``state+velocity`` (pushblock: also each block's velocity; see VIEWS)."""
    snapshot_minutes: float = 0.0
    """Also end a shorter run inside this one: at this minute a held-in checkpoint, then the agent a run of that
    many minutes would have ended with (the best so far with keep_best), scored on held-out too; 0: none."""
    branches: int = 0
    """Branch data: each training boundary the loop keeps is where this many later episodes start (a sub-env whose
    episode ended restarts there, exactly, through the vector env's restart()), each with the actor's fresh noise;
    so the critic sees several chunks from one state, and what each led to; 0: off."""
    branch_fraction: float = 0.5
    """With ``branches``: the share of ended episodes that restart at a kept boundary (the rest start afresh)."""
    branch_greedy: bool = False
    """With ``branches``: a restarted episode samples only its first chunk's noise, then plays the actor's
    deterministic noise, so its return values that chunk under the agent that is evaluated (as the probe does)."""
    rank_steps: int = 0
    """With ``branches`` (NA): action-critic steps per vector step that order the chunks tried at one kept boundary
    by their returns (:mod:`~rollcap.rollout.learn.dsrl_branch`), 32 boundaries a step; 0: off."""
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task: expected one of {sorted(TASKS)}, got {self.task!r}")
        viewed(TASKS[self.task], self.view)
        self._check_counts()
        self._check_numbers()

    def _check_counts(self) -> None:
        """The integer fields: each in range (the seed streams stay apart), held-in episodes where they are asked for."""
        for name in ("num_envs", "critic_steps", "threads", "buffer", "max_transitions"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        for name in (
            "init_steps",
            "distill_steps",
            "actor_steps",
            "seed",
            "heldin_every",
            "heldin_episodes",
            "heldin_envs",
            "branches",
            "rank_steps",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
        for name, hi in (
            ("seed", MAX_SEED),
            ("num_envs", MAX_ENVS),
            ("heldin_envs", MAX_ENVS),
            ("heldin_episodes", MAX_HELDIN),
        ):
            if getattr(self, name) > hi:
                raise ValueError(
                    f"{name}: expected at most {hi} (the run seed streams stay apart), got {getattr(self, name)!r}"
                )
        if self.heldin_every and not (self.heldin_episodes and self.heldin_envs):
            raise ValueError("heldin_episodes: expected >= 1 with heldin_every > 0 (and heldin_envs >= 1)")

    def _check_numbers(self) -> None:
        """The flags, durations, rewards and fractions: each of its type and range."""
        for name in ("keep_best", "branch_greedy"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, got {getattr(self, name)!r}")
        if not (isinstance(self.minutes, (int, float)) and 0 < self.minutes < math.inf):
            raise ValueError(f"minutes: expected a finite number > 0, got {self.minutes!r}")
        snap = self.snapshot_minutes
        if not (isinstance(snap, (int, float)) and not isinstance(snap, bool) and 0 <= snap < self.minutes):
            raise ValueError(
                f"snapshot_minutes: expected 0 (none) or a number below minutes ({self.minutes}), got {snap!r}"
            )
        for name in ("success_reward", "env_reward_scale", "chunk_penalty", "log_every_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite number, got {v!r}")
        if self.rank_steps and not (self.branches and self.agent.algorithm == "na"):
            raise ValueError(f"rank_steps: needs branches >= 1 and the na algorithm, got branches={self.branches}, algorithm={self.agent.algorithm!r}")  # fmt: skip
        f = self.branch_fraction
        if not (isinstance(f, (int, float)) and not isinstance(f, bool) and 0 <= f <= 1):
            raise ValueError(f"branch_fraction: expected a number in [0, 1], got {f!r}")
        if self.log_every_s < 0:
            raise ValueError(f"log_every_s: expected a number >= 0, got {self.log_every_s!r}")

    def to_json(self) -> dict:
        return asdict(self)


def train(cfg: TrainConfig, progress=print, scalars=None) -> tuple[NoiseAgent, dict]:
    """Train DSRL on ``cfg.task``; returns the agent (the kept one: :attr:`TrainConfig.keep_best`) and
    ``{"curve": [...], "held_in": [...], "kept": {...}, "budget": {...}}``. ``scalars(prefix, point, transitions)``, when
    given, gets each curve point (``"train"``) and held-in checkpoint (``"held_in"``) as it happens (TensorBoard)."""
    from gymnasium.vector import AutoresetMode

    from rollcap.rollout.gym.vector import make_noise_steering_vector_env

    task = viewed(TASKS[cfg.task], cfg.view)
    code = _task_code(task)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)  # the updates' budget, given back on return
    venvs = []
    try:
        for n in (cfg.num_envs, cfg.heldin_envs if cfg.heldin_every else 0):
            if n:
                venvs.append(make_noise_steering_vector_env(n, config={"execute_steps": task.execute_steps},
                             parts=task.parts(cfg.threads), autoreset_mode=AutoresetMode.SAME_STEP))  # fmt: skip
        heldin = None
        if cfg.heldin_every:
            heldin = HeldIn(venvs[1], heldin_seeds(cfg.seed, cfg.heldin_episodes), lambda o: features(o, code, task.extra), cfg.agent.gamma)  # fmt: skip
        return _train(cfg, task, venvs[0], code, progress, heldin, scalars or (lambda prefix, point, step: None))
    finally:
        for v in venvs:
            v.close()
        torch.set_num_threads(threads)


def _update(cfg: TrainConfig, agent: NoiseAgent, buf: ReplayBuffer, rng: np.random.Generator, branches) -> dict:
    """One vector step's updates, in order: the critic's, the distillation's (NA), the ranking's (branches), the
    actor's; returns their latest statistics."""
    stats: dict = {}
    for _ in range(cfg.critic_steps):
        stats.update(agent.critic_step(buf.sample(rng, cfg.agent.batch)))
    for _ in range(cfg.distill_steps if cfg.agent.algorithm == "na" else 0):
        stats.update(agent.distill_step(buf.sample(rng, cfg.agent.batch)))
    for _ in range(cfg.rank_steps if branches is not None else 0):
        if (pairs := branches.pairs(rng, 32)) is not None:
            stats.update(agent.rank_step(pairs))
    for _ in range(cfg.actor_steps):
        stats.update(agent.actor_step(buf.sample(rng, cfg.agent.batch)))
    return stats


def _train(  # noqa: C901, PLR0912, PLR0915 - the DSRL loop read top to bottom: act, step, store, update, check, log
    cfg: TrainConfig, task: Task, venv, code, progress, heldin: HeldIn | None, scalars
) -> tuple[NoiseAgent, dict]:
    n, (h, a) = cfg.num_envs, venv.chunk_shape
    e = task.execute_steps
    obs, _ = venv.reset(seed=[TRAIN_SEED_BASE + 100 * cfg.seed + i for i in range(n)])
    feat = features(obs, code, task.extra)
    agent = NoiseAgent(feat.shape[1], h * a, e * a, cfg.agent, seed=cfg.seed)
    buf = ReplayBuffer(cfg.buffer, feat.shape[1], h * a, e * a)
    rng = np.random.default_rng([cfg.seed, 0xD5])
    pending = [-1] * n
    nstep = cfg.agent.n_step
    windows: list[list] = [[] for _ in range(n)]  # n-step: each sub-env's transitions whose n chunks are not all in
    outcomes: list[bool] = []
    curve, stats = [], {}
    t0 = last_log = time.perf_counter()
    transitions = updates = 0
    timing = {"env": 0.0, "update": 0.0, "held_in": 0.0}
    keep, points = KeepBest(), []
    snap: dict | None = None
    branches = Branches(n, cfg.branches, cfg.branch_fraction, cfg.agent.gamma) if cfg.branches else None

    def budget_now() -> dict:
        return {"seconds": round(time.perf_counter() - t0, 1), "transitions": transitions, "env_steps": transitions * e, "episodes": len(outcomes), "vector_steps": transitions // n,
                "critic_updates": updates * cfg.critic_steps, "distill_updates": updates * (cfg.distill_steps if cfg.agent.algorithm == "na" else 0),
                "actor_updates": updates * cfg.actor_steps, "env_seconds": round(timing["env"], 1), "update_seconds": round(timing["update"], 1),
                "held_in_seconds": round(timing["held_in"], 1), "held_in_checkpoints": len(points), "restarts": branches.restarts if branches else 0}  # fmt: skip

    def take_snapshot() -> dict:
        """What a run of ``cfg.snapshot_minutes`` would have ended with: a last held-in checkpoint, then the kept agent."""
        if heldin is not None and points[-1]["transitions"] != transitions:
            checkpoint()
        if heldin is not None and cfg.keep_best:
            state, kept = keep.state, keep.point
        else:
            state, kept = weights(agent), (points[-1] if points else None)
        progress(f"snapshot at minute {cfg.snapshot_minutes:g}: " + (kept_line(kept) if kept else "no held-in stream"))
        return {"minutes": cfg.snapshot_minutes, "kept": kept, "budget": budget_now(), "state": state}

    def checkpoint():
        t1 = time.perf_counter()
        if heldin.zero is None:
            heldin.baselines(cfg.seed)
        p = {"minutes": round((t1 - t0) / 60, 2), "transitions": transitions, "updates": updates, **heldin.score(agent),
             "entropy": stats.get("entropy"), "alpha": round(agent.alpha, 6)}  # fmt: skip
        p["kept"] = keep.offer(agent, p) if cfg.keep_best else False
        points.append(p)
        timing["held_in"] += time.perf_counter() - t1
        progress(line(p, keep.point if cfg.keep_best else None))
        scalars("held_in", {**p, "success_rate": p["success"] / p["episodes"]}, transitions)

    if heldin is not None:
        checkpoint()
    next_check = cfg.heldin_every
    while transitions < cfg.max_transitions and time.perf_counter() - t0 < 60 * cfg.minutes:
        t1 = time.perf_counter()
        steering = transitions >= cfg.init_steps
        noise = agent.act(feat, deterministic=False) if steering else rng.standard_normal((n, h * a)).astype(np.float32)
        if branches is not None and cfg.branch_greedy and steering and (greedy := branches.greedy()).any():
            noise[greedy] = agent.act(feat[greedy], deterministic=True)
        obs, reward, term, trunc, info = venv.step(noise.reshape(n, h, a))
        timing["env"] += time.perf_counter() - t1
        done = term | trunc
        final = info.get("final_obs")
        nxt = (
            features(
                {k: np.stack([final[i][k] if done[i] else obs[k][i] for i in range(n)]) for k in obs_keys(task)},
                code,
                task.extra,
            )
            if done.any()
            else features(obs, code, task.extra)
        )
        for i in range(n):
            src = info["final_info"] if done[i] else info
            inf = {k: src[k][i] for k in ("policy_chunk", "is_success") if k in src and src[f"_{k}"][i]}
            chunk = np.asarray(inf["policy_chunk"], np.float32)[:e].reshape(-1)
            success = bool(done[i] and inf.get("is_success", False))
            r = cfg.success_reward * success + cfg.env_reward_scale * float(reward[i]) - cfg.chunk_penalty
            if done[i]:
                outcomes.append(success)
            if branches is not None:
                branches.record(i, feat[i], chunk, r, bool(done[i]))
            if nstep > 1:
                windows[i].append((feat[i], noise[i], chunk, r))
                n_step_rows(buf, windows[i], nstep, cfg.agent.gamma, bool(done[i]), nxt[i])
                continue
            if pending[i] >= 0:
                buf.complete(pending[i], chunk)
            ready = 1.0 if (done[i] or cfg.agent.algorithm == "sac") else 0.0
            slot = buf.add(
                obs=feat[i], noise=noise[i], action=chunk, reward=r, done=float(done[i]), next_obs=nxt[i], ready=ready
            )
            pending[i] = -1 if done[i] else slot
        if branches is not None:
            branches.step(venv, obs, done, rng)
        feat = features(obs, code, task.extra)
        transitions += n
        if transitions >= cfg.init_steps:
            t1 = time.perf_counter()
            stats.update(_update(cfg, agent, buf, rng, branches))
            updates += 1
            timing["update"] += time.perf_counter() - t1
        if heldin is not None and transitions >= next_check:
            next_check += cfg.heldin_every
            checkpoint()
        if cfg.snapshot_minutes and snap is None and time.perf_counter() - t0 >= 60 * cfg.snapshot_minutes:
            snap = take_snapshot()
        now = time.perf_counter()
        if now - last_log >= cfg.log_every_s:
            last_log = now
            recent = outcomes[-100:]
            point = {"seconds": round(now - t0, 1), "transitions": transitions, "episodes": len(outcomes), "updates": updates,
                     "train_success_last100": (sum(recent) / len(recent)) if recent else None, **{k: round(v, 5) for k, v in stats.items()}}  # fmt: skip
            curve.append(point)
            progress(" ".join(f"{k}={v}" for k, v in point.items()))
            scalars("train", point, transitions)
    if heldin is not None and points[-1]["transitions"] != transitions:
        checkpoint()
    last = None
    if heldin is not None and cfg.keep_best:
        if keep.point is not points[-1]:  # an earlier agent is kept: the last one comes along, for comparison
            last = {"point": points[-1], "state": weights(agent)}
        keep.restore(agent)
    kept = keep.point if cfg.keep_best else (points[-1] if points else None)
    if kept is not None:
        progress(kept_line(kept))
    budget = budget_now()
    return agent, {"curve": curve, "budget": budget, "held_in": points, "kept": kept, "snapshot": snap, "last": last}


def n_step_rows(buf: ReplayBuffer, win: list, nstep: int, gamma: float, done: bool, final_obs: np.ndarray) -> None:
    """Move the transitions of one sub-env's window ``win`` (its latest ``(obs, noise, chunk, reward)`` last) whose
    n-step targets are now known into ``buf``: the oldest once ``nstep`` chunks follow it (its next state and chunk
    are the last row's), all of them when the episode ended (``done``: no bootstrap; ``final_obs`` stands in)."""

    def put(rows, next_obs, next_action, ended):
        ret = 0.0
        for *_, r in reversed(rows):
            ret = r + gamma * ret
        o, w, a, _ = rows[0]
        buf.add(obs=o, noise=w, action=a, reward=ret, done=float(ended), next_obs=next_obs, next_action=next_action,
                ready=1.0, discount=gamma ** len(rows))  # fmt: skip

    if len(win) == nstep + 1:
        put(win[:nstep], win[nstep][0], win[nstep][2], False)
        win.pop(0)
    if done:
        while win:
            put(win, final_obs, np.zeros_like(win[0][2]), True)
            win.pop(0)
