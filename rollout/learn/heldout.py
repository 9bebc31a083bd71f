"""A trained agent against a baseline on the same held-out episodes, paired: what the RL examples print at the end.

:func:`held_out_successes` plays episodes ``episode_seed(run_seed, j)`` of a gymnasium env (``reset(seed=run_seed)``,
then ``reset()`` for each next episode: the single envs' seeding, so any process plays the same ones) with an
``act(obs)`` of yours; :func:`paired_lines` states two such runs over the same episodes: each success rate with its
Wilson interval, and their difference with its interval and exact McNemar p (:mod:`rollcap.rollout.stats`).
:class:`SB3Run`, :func:`train_sb3`, :func:`score_sb3` and :func:`write_result` are what the SB3 examples
(``sb3_batched.py``, ``residual_rl.py``) share: their flags, training with its log, the paired score, result.json.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollcap.rollout.stats import mcnemar_p, paired_difference, wilson


def held_out_successes(env, act: Callable, run_seed: int, episodes: int, max_steps: int = 10_000) -> list[bool]:
    """Whether each of ``episodes`` episodes of run ``run_seed`` succeeded (``info["is_success"]`` at its end),
    acting ``act(obs)``; an episode still running after ``max_steps`` steps counts as failed."""
    out = []
    for j in range(episodes):
        obs, _ = env.reset(seed=run_seed) if j == 0 else env.reset()
        success = False
        for _ in range(max_steps):
            obs, _, terminated, truncated, info = env.step(act(obs))
            if terminated or truncated:
                success = bool(info.get("is_success", False))
                break
        out.append(success)
    return out


def paired_lines(a_name: str, a: list[bool], b_name: str, b: list[bool], run_seed: int) -> list[str]:
    """``a`` and ``b`` (successes over the same episodes) as a report states them, paired episode by episode."""
    n = len(a)
    lines = []
    for name, v in ((a_name, a), (b_name, b)):
        _, lo, hi = wilson(sum(v), n)
        lines.append(f"{name}: {sum(v)}/{n} = {sum(v) / n:.1%} (95% Wilson {lo:.1%}-{hi:.1%})")
    fixed = sum(x and not y for x, y in zip(a, b))
    broken = sum(y and not x for x, y in zip(a, b))
    d, lo, hi = paired_difference(fixed, broken, n)
    lines.append(
        f"{a_name} - {b_name}: {100 * d:+.1f} points (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}), {fixed} fixed / "
        f"{broken} broken, exact McNemar p = {mcnemar_p(fixed, broken):.3g}; episodes episode_seed({run_seed}, j), j < {n}"
    )
    return lines


@dataclass
class SB3Run:
    """The flags an SB3 example shares: its budget, its episodes' length, its seeds, its held-out episodes, its log."""

    timesteps: int = 20_000
    """SB3 steps, over all sub-envs (one step of one sub-env is one chunk)."""
    learning_starts: int = 1000
    """SAC: steps of uniformly random actions before its first update."""
    max_chunks: int = 20
    """Chunks after which an episode is cut (max_episode_steps; stop reason time_limit)."""
    seed: int = 0
    """SB3's seed; sub-env i trains on run seed + i."""
    eval_seed: int = 2
    """Run seed of the held-out episodes (the single env's episodes episode_seed(eval_seed, j))."""
    eval_episodes: int = 100
    """Held-out episodes, each played by the agent and by the baseline."""
    tensorboard: Path | None = None
    """Also write SB3's log as TensorBoard event files here."""

    def problems(self) -> list[str]:
        """What is wrong with these flags, one line each (empty: nothing)."""
        from rollcap.rollout.learn.logs import tensorboard_missing

        checks = (
            (self.timesteps < 1, f"--timesteps: expected an integer >= 1, got {self.timesteps}"),
            (self.max_chunks < 1, f"--max-chunks: expected an integer >= 1, got {self.max_chunks}"),
            (self.eval_episodes < 1, f"--eval-episodes: expected an integer >= 1, got {self.eval_episodes}"),
            (self.tensorboard is not None and bool(tensorboard_missing()), f"--tensorboard: {tensorboard_missing()}"),
        )
        return [msg for bad, msg in checks if bad]


def train_sb3(model, run: SB3Run, log_interval: int) -> dict:
    """``model.learn(run.timesteps)`` logging to stdout (and TensorBoard); the steps, seconds and SB3's success rate."""
    from rollcap.rollout.learn.logs import sb3_logger

    model.set_logger(sb3_logger(True, run.tensorboard))
    t0 = time.perf_counter()
    model.learn(run.timesteps, log_interval=log_interval)
    rate = None if not model.ep_success_buffer else float(np.mean(model.ep_success_buffer))
    return {"steps": int(model.num_timesteps), "seconds": time.perf_counter() - t0, "success_rate_last_100": rate}


def score_sb3(model, env, agent_name: str, baseline: tuple[str, Callable], run: SB3Run) -> dict:
    """The SB3 agent's deterministic action and ``baseline`` (its name, its ``act(obs)``) on the same held-out
    episodes of ``env`` (closed after), paired; the lines are printed too."""
    try:
        agent = held_out_successes(
            env, lambda o: model.predict(o, deterministic=True)[0], run.eval_seed, run.eval_episodes
        )
        base = held_out_successes(env, baseline[1], run.eval_seed, run.eval_episodes)
    finally:
        env.close()
    lines = paired_lines(agent_name, agent, baseline[0], base, run.eval_seed)
    print("\n".join(lines))
    return {"agent": agent, "baseline": base, "lines": lines}


def write_result(out: Path, **sections) -> Path:
    """``out/result.json`` (the directory made) holding ``sections`` (paths and other values as text)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    path.write_text(json.dumps(sections, indent=1, default=str))
    print(f"-> {path}")
    return path


def parse_sb3_example(doc: str, args_cls: type, problems: Callable, argv=None) -> tuple:
    """An SB3 example's flags: its own ``args_cls`` and :class:`SB3Run`'s, parsed; ``problems(args)`` (and
    :meth:`SB3Run.problems`) name what is wrong, and the first is one line on stderr, exit 2, before anything runs."""
    import argparse
    import sys

    from rollcap.rollout.options import Options

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    opts = Options(ap)
    opts.add(args_cls)
    opts.add(SB3Run)
    ns = ap.parse_args(argv)
    args, run = args_cls(**opts.values(ns, args_cls)), SB3Run(**opts.values(ns, SB3Run))
    wrong = [*problems(args), *run.problems()]
    if wrong:
        print(f"{ap.prog}: {wrong[0]}", file=sys.stderr)
        sys.exit(2)
    return args, run
