"""DSRL's tasks, what the agent sees of them, and the held-out side (:mod:`~rollcap.rollout.learn.dsrl_na` trains).

- :data:`TASKS`: the two settings the benchmark reports (PushBlock at whole 8-action chunks with the shipped policy;
  MetaWorld peg-insert-side with the MT10 policy at 4 of 8 actions), each with its held-out run seed; :data:`VIEWS`
  and :func:`features`: the agent's view of an observation.
- :func:`evaluate`: the actor's deterministic noise on held-out episodes ``episode_seed(eval_seed, i)``, batch 1,
  with the critic's value and the discounted return of every chunk (the critic against Monte-Carlo), and what
  noise the actor picks; :func:`baseline` scores the frozen policy (exactly ``rollcap run --seed eval_seed``) and
  all-zero noise on the same seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from rollcap.rollout.spec import Parts
from rollcap.rollout.learn.dsrl_heldin import RESERVED
from rollcap.rollout.learn.noise_agent import NoiseAgent
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
    corr = "n/a" if c["corr"] is None else f"{c['corr']:.3f}"  # undefined with under 3 chunks or a constant side
    out.append(
        f"critic vs Monte-Carlo return on the steered chunks: Q {c['q_mean']:.3f} vs G {c['return_mean']:.3f} (bias {c['bias']:+.3f}, corr {corr})"
    )
    return out
