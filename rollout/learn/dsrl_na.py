"""DSRL on the batched vector env: train a noise agent (:mod:`~rollcap.rollout.learn.noise_agent`), then score it
against the frozen policy on held-out episodes, paired.

- :data:`TASKS`: the two settings the benchmark reports (PushBlock at whole 8-action chunks with the shipped policy;
  MetaWorld peg-insert-side with the MT10 policy at 4 of 8 actions), each with its held-out run seed.
- :func:`train`: N sub-envs of :class:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv` (one policy graph at
  batch N) feed a replay buffer; after ``init_steps`` transitions of the policy's own noise (standard normal) the
  actor's sampled noise steers them; every vector step does ``critic_steps`` critic, ``distill_steps`` noise-critic
  (NA) and ``actor_steps`` actor updates. Stops at a wall-clock or transition budget; logs a learning curve. Every
  ``heldin_every`` transitions (and at 0 and at the end) it scores the agent on the held-in stream, paired against
  zero noise (:mod:`~rollcap.rollout.learn.dsrl_heldin`), and ends with the best agent by that score (``keep_best``).
- :func:`evaluate`: the actor's deterministic noise on held-out episodes ``episode_seed(eval_seed, i)``, batch 1,
  with the critic's value and the discounted return of every chunk (the critic against Monte-Carlo), and what
  noise the actor picks; :func:`baseline` scores the frozen policy (exactly ``rollcap run --seed eval_seed``) and
  all-zero noise on the same seeds.

Reward: ``success_reward`` on the chunk that succeeds (success ends the episode), plus ``env_reward_scale`` x the
env's own reward, minus ``chunk_penalty`` a chunk. An episode's time limit ends it too (no bootstrap past it: the
held-out score is success within the limit).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from rollcap.rollout.build import Parts
from rollcap.rollout.learn.dsrl_heldin import (
    MAX_ENVS,
    MAX_HELDIN,
    MAX_SEED,
    RESERVED,
    TRAIN_SEED_BASE,
    HeldIn,
    KeepBest,
)
from rollcap.rollout.learn.dsrl_heldin import heldin_seeds, kept_line, line
from rollcap.rollout.learn.noise_agent import AgentConfig, NoiseAgent, Replay
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.stats import mcnemar_p, paired_difference, wilson


@dataclass(frozen=True)
class Task:
    """One benchmark setting: the env and checkpoints, the chunk execution, the held-out run seed."""

    name: str
    env_id: str
    env_kwargs: dict | None
    execute_steps: int
    eval_seed: int
    extra: tuple[str, ...] = ()
    """Observation keys the agent sees beside ``state`` (its :data:`VIEWS`)."""

    def parts(self, threads: int = 1) -> Parts:
        return Parts(env_id=self.env_id, env_kwargs=self.env_kwargs, critic="none", threads=threads)


TASKS = {
    "pushblock": Task("pushblock", "rollcap/PushBlock-v0", None, 8, 2),
    "peg-insert-side": Task(
        "peg-insert-side", "rollcap/MetaWorld-peg-insert-side-v3", {"render_images": False}, 4, 31337
    ),
}


VIEWS = ("state", "state+velocity")
"""The agent's view: the env's ``state`` (and the task code), or PushBlock's state with each block's velocity (env
option ``block_velocity``): PushBlock's state has the blocks' poses, not how they move (MetaWorld's 39 numbers
already hold the previous frame)."""


def viewed(task: Task, view: str) -> Task:
    """``task`` with the env options and observation keys of ``view``."""
    if view == "state":
        return task
    if view != "state+velocity" or task.name != "pushblock":
        raise ValueError(f"view: expected one of {VIEWS} ({VIEWS[1]!r} on pushblock only), got {view!r} on {task.name}")
    return replace(task, env_kwargs={**(task.env_kwargs or {}), "block_velocity": True}, extra=("block_velocity",))


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
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task: expected one of {sorted(TASKS)}, got {self.task!r}")
        viewed(TASKS[self.task], self.view)
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
        if not isinstance(self.keep_best, bool):
            raise ValueError(f"keep_best: expected True or False, got {self.keep_best!r}")
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
        if self.log_every_s < 0:
            raise ValueError(f"log_every_s: expected a number >= 0, got {self.log_every_s!r}")

    def to_json(self) -> dict:
        return asdict(self)


def features(obs: dict, code, extra: tuple[str, ...] = ()) -> np.ndarray:
    """The agent's view of a batch of vector-env observations: ``state``, the ``extra`` keys and the task code,
    float32 ``[B, D]``."""
    parts = [np.asarray(obs["state"], np.float32), *(np.asarray(obs[k], np.float32) for k in extra)]
    if code is not None:
        parts.append(np.stack([code.encode(t) for t in obs["instruction_tokens"]]))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, 1).astype(np.float32)


def obs_keys(task: Task) -> tuple[str, ...]:
    """The observation keys :func:`features` reads for ``task``."""
    return ("state", *task.extra, "instruction_tokens")


def _task_code(task: Task):
    from rollcap.rollout.learn.dsrl import task_code_for

    return task_code_for(task.env_id)


def train(cfg: TrainConfig, progress=print) -> tuple[NoiseAgent, dict]:
    """Train DSRL on ``cfg.task``; returns the agent (the kept one: :attr:`TrainConfig.keep_best`) and
    ``{"curve": [...], "held_in": [...], "kept": {...}, "budget": {...}}``."""
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
        return _train(cfg, task, venvs[0], code, progress, heldin)
    finally:
        for v in venvs:
            v.close()
        torch.set_num_threads(threads)


def _train(cfg: TrainConfig, task: Task, venv, code, progress, heldin: HeldIn | None) -> tuple[NoiseAgent, dict]:
    n, (h, a) = cfg.num_envs, venv.chunk_shape
    e = task.execute_steps
    obs, _ = venv.reset(seed=[TRAIN_SEED_BASE + 100 * cfg.seed + i for i in range(n)])
    feat = features(obs, code, task.extra)
    agent = NoiseAgent(feat.shape[1], h * a, e * a, cfg.agent, seed=cfg.seed)
    buf = Replay(cfg.buffer, feat.shape[1], h * a, e * a)
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

    def budget_now() -> dict:
        return {"seconds": round(time.perf_counter() - t0, 1), "transitions": transitions, "env_steps": transitions * e, "episodes": len(outcomes), "vector_steps": transitions // n,
                "critic_updates": updates * cfg.critic_steps, "distill_updates": updates * (cfg.distill_steps if cfg.agent.algorithm == "na" else 0),
                "actor_updates": updates * cfg.actor_steps, "env_seconds": round(timing["env"], 1), "update_seconds": round(timing["update"], 1),
                "held_in_seconds": round(timing["held_in"], 1), "held_in_checkpoints": len(points)}  # fmt: skip

    def take_snapshot() -> dict:
        """What a run of ``cfg.snapshot_minutes`` would have ended with: a last held-in checkpoint, then the kept agent."""
        if heldin is not None and points[-1]["transitions"] != transitions:
            checkpoint()
        if heldin is not None and cfg.keep_best:
            state, kept = {k: v.clone() for k, v in keep.state.items()}, keep.point
        else:
            state, kept = (
                {k: v.detach().clone() for k, v in agent.state_dict().items()},
                (points[-1] if points else None),
            )
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
        progress(line(p))

    if heldin is not None:
        checkpoint()
    next_check = cfg.heldin_every
    while transitions < cfg.max_transitions and time.perf_counter() - t0 < 60 * cfg.minutes:
        t1 = time.perf_counter()
        steering = transitions >= cfg.init_steps
        noise = agent.act(feat, deterministic=False) if steering else rng.standard_normal((n, h * a)).astype(np.float32)
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
        feat = features(obs, code, task.extra)
        transitions += n
        if transitions >= cfg.init_steps:
            t1 = time.perf_counter()
            for _ in range(cfg.critic_steps):
                stats.update(agent.critic_step(buf.sample(rng, cfg.agent.batch)))
            for _ in range(cfg.distill_steps if cfg.agent.algorithm == "na" else 0):
                stats.update(agent.distill_step(buf.sample(rng, cfg.agent.batch)))
            for _ in range(cfg.actor_steps):
                stats.update(agent.actor_step(buf.sample(rng, cfg.agent.batch)))
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
    if heldin is not None and points[-1]["transitions"] != transitions:
        checkpoint()
    last_state = {k: v.detach().clone() for k, v in agent.state_dict().items()}
    if heldin is not None and cfg.keep_best:
        keep.restore(agent)
    kept = keep.point if cfg.keep_best else (points[-1] if points else None)
    if kept is not None:
        progress(kept_line(kept))
    budget = budget_now()
    last = None
    if kept is not None and kept is not points[-1]:  # keep-best restored an earlier agent: the last one, for comparison
        last = {"point": points[-1], "state": last_state}
    return agent, {"curve": curve, "budget": budget, "held_in": points, "kept": kept, "snapshot": snap, "last": last}


def n_step_rows(buf: Replay, win: list, nstep: int, gamma: float, done: bool, final_obs: np.ndarray) -> None:
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


# ---------------------------------------------------------------- evaluation
def _single_env(task: Task):
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.gym.envs import NoiseSteeringEnv

    parts = task.parts()
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    return NoiseSteeringEnv(env, policy, critic, HostConfig(execute_steps=task.execute_steps))


def baseline(task_name: str, episodes: int, progress=print, eval_seed: int | None = None) -> dict:
    """The frozen policy (its own derived noise: ``rollcap run --seed eval_seed``) and all-zero noise on the held-out
    seeds (``eval_seed``: another held-out run seed than the task's)."""
    from rollcap.rollout.learn.dsrl import frozen_episodes

    task = held_out(task_name, eval_seed)
    core = _single_env(task)
    try:
        frozen = [e.success for e in frozen_episodes(core, task.eval_seed, episodes)]
        progress(f"frozen: {sum(frozen)}/{episodes}")
        zero = _steered(core, task, lambda f: np.zeros((1, int(np.prod(core.chunk_shape))), np.float32), episodes)[0]
        progress(f"zero noise: {sum(zero)}/{episodes}")
    finally:
        core.close()
    return {"task": task_name, "eval_seed": task.eval_seed, "episodes": episodes, "frozen": frozen, "zero_noise": zero}


def _steered(core, task: Task, act, episodes: int, probe=None) -> tuple[list[bool], list[dict]]:
    code = _task_code(task)
    keys = obs_keys(task)
    out, chunks = [], []
    obs, info = core.reset(seed=task.eval_seed)
    for i in range(episodes):
        if i:
            obs, info = core.reset()
        rows, done = [], False
        while not done:
            f = features({k: np.asarray(obs[k])[None] for k in keys}, code, task.extra)
            w = act(f)
            obs, _, term, trunc, info = core.step(w.reshape(core.chunk_shape))
            done = term or trunc
            if probe is not None:
                rows.append({**probe(f, w, info), "reward": float(done and info.get("is_success", False))})
        out.append(bool(info["is_success"]))
        chunks.append(rows)
    return out, chunks


def held_out(task_name: str, eval_seed: int | None) -> Task:
    """``task_name``'s task with the held-out run seed ``eval_seed`` (None: its own); ValueError for a training run seed."""
    from dataclasses import replace

    task = TASKS[task_name]
    if eval_seed is None:
        return task
    if RESERVED[0] <= eval_seed < RESERVED[1]:
        raise ValueError(
            f"eval_seed {eval_seed} is a training run seed or a held-in one ({RESERVED[0]} to {RESERVED[1] - 1})"
        )
    return replace(task, eval_seed=int(eval_seed))


def evaluate(agent: NoiseAgent, task_name: str, episodes: int, base: dict, gamma: float, view: str = "state") -> dict:
    """The agent's deterministic noise on ``base``'s held-out seeds, paired against it (:func:`baseline`); ``view``:
    what the agent sees (:data:`VIEWS`; the baseline's episodes do not depend on it: no policy reads the extra keys)."""
    task = viewed(held_out(task_name, base["eval_seed"]), view)
    e = task.execute_steps

    @torch.no_grad()
    def probe(f, w, info):
        o, n = torch.as_tensor(f), torch.as_tensor(w)
        row = {"q_noise": float(agent.noise_value(o, n)[0]), "noise_abs": float(np.abs(w).mean()),
               "edge": float(np.mean(np.abs(w) >= 0.99 * agent.cfg.magnitude)), "noise": w[0]}  # fmt: skip
        if agent.cfg.algorithm == "na" and "policy_chunk" in info:
            a = torch.as_tensor(np.asarray(info["policy_chunk"], np.float32)[:e].reshape(1, -1))
            row["q_action"] = float(agent.action_value(o, a)[0])
        return row

    core = _single_env(task)
    try:
        steered, chunks = _steered(core, task, lambda f: agent.act(f, deterministic=True), episodes, probe)
    finally:
        core.close()
    q, g, noise = [], [], []
    for rows in chunks:
        ret = 0.0
        for row in reversed(rows):
            ret = row["reward"] + gamma * ret
            q.append(row["q_noise"])
            g.append(ret)
            noise.append(row["noise"])
    q, g, noise = np.asarray(q), np.asarray(g), np.asarray(noise)
    frozen, zero = base["frozen"][:episodes], base["zero_noise"][:episodes]
    fixed = sum(s and not f for s, f in zip(steered, frozen))
    broken = sum(f and not s for s, f in zip(steered, frozen))
    zfixed = sum(s and not z for s, z in zip(steered, zero))
    zbroken = sum(z and not s for s, z in zip(steered, zero))
    return {
        "episodes": episodes, "eval_seed": task.eval_seed, "episode_seeds": [episode_seed(task.eval_seed, i) for i in range(episodes)],
        "steered_success": sum(steered), "frozen_success": sum(frozen), "zero_noise_success": sum(zero),
        "steered_wilson": wilson(sum(steered), episodes), "frozen_wilson": wilson(sum(frozen), episodes), "zero_noise_wilson": wilson(sum(zero), episodes),
        "fixed": fixed, "broken": broken, "mcnemar_p": mcnemar_p(fixed, broken), "difference_and_95ci": paired_difference(fixed, broken, episodes),
        "vs_zero_noise": {"fixed": zfixed, "broken": zbroken, "mcnemar_p": mcnemar_p(zfixed, zbroken), "difference_and_95ci": paired_difference(zfixed, zbroken, episodes)},
        "steered": steered, "frozen": frozen, "zero_noise": zero,
        "critic_vs_monte_carlo": {"chunks": len(q), "q_mean": float(q.mean()), "return_mean": float(g.mean()), "bias": float((q - g).mean()),
                                  "corr": float(np.corrcoef(q, g)[0, 1]) if len(q) > 2 and q.std() > 0 and g.std() > 0 else None},
        "noise": {"abs_mean": float(np.abs(noise).mean()), "edge_fraction": float(np.mean(np.abs(noise) >= 0.99 * agent.cfg.magnitude)),
                  "spread_over_states": float(noise.std(0).mean()), "mean_norm_per_element": float(np.sqrt((noise.mean(0) ** 2).mean())),
                  "policy_own_abs_mean": math.sqrt(2 / math.pi)},
    }  # fmt: skip


def summary_lines(result: dict) -> list[str]:
    """The held-out comparison in a few lines."""
    n = result["episodes"]
    out = []
    for name in ("steered", "frozen", "zero_noise"):
        k = result[f"{name}_success"]
        _, lo, hi = result[f"{name}_wilson"]
        out.append(f"{name.replace('_', ' ')}: {k}/{n} = {k / n:.1%} (95% Wilson {lo:.1%}-{hi:.1%})")
    d, lo, hi = result["difference_and_95ci"]
    out.append(
        f"steered - frozen: {100 * d:+.1f} points (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}), {result['fixed']} fixed / {result['broken']} broken, McNemar p = {result['mcnemar_p']:.3g}"
    )
    z = result["vs_zero_noise"]
    d, lo, hi = z["difference_and_95ci"]
    out.append(
        f"steered - zero noise: {100 * d:+.1f} points (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}), {z['fixed']} fixed / {z['broken']} broken, McNemar p = {z['mcnemar_p']:.3g}"
    )
    c = result["critic_vs_monte_carlo"]
    out.append(
        f"critic vs Monte-Carlo return on the steered chunks: Q {c['q_mean']:.3f} vs G {c['return_mean']:.3f} (bias {c['bias']:+.3f}, corr {c['corr']})"
    )
    return out
