"""A trained agent against a baseline on the same held-out episodes, paired: what the RL examples print at the end.

:func:`held_out_successes` plays episodes ``episode_seed(run_seed, j)`` of a gymnasium env (``reset(seed=run_seed)``,
then ``reset()`` for each next episode: the single envs' seeding, so any process plays the same ones) with an
``act(obs)`` of yours; :func:`paired_lines` states two such runs over the same episodes: each success rate with its
Wilson interval, and their difference with its interval and exact McNemar p (:mod:`rollcap.rollout.stats`).
"""

from __future__ import annotations

from collections.abc import Callable

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
