"""RECAP stage 5, evaluate: before vs after on held-out seeds, with intervals and a paired test.

Held-out episode seeds come from a seed stream of their own
(:func:`stream_seeds`: spawn key ``(0x2EC4, stream, i)`` under the iteration
seed), distinct from ``episode_seed`` (which every ``rollcap run`` and the
demonstrations use), and :func:`check_disjoint` refuses any overlap with the
collected episodes. Stream 1 is validation (the guidance weight), stream 2
the final evaluation.

Each policy runs every seed through the real :class:`~rollcap.rollout.host.RolloutHost`
(captured graph, no critic: without a threshold it cannot change an outcome),
so an outcome is the one ``rollcap run`` gives for that seed. Both policies
see the same seeds, so the comparison is paired: the success rates carry 95%
Wilson intervals, the difference a 95% interval over the paired differences
(normal approximation), and the exact McNemar test counts the seeds only one
of them solved.
"""

from __future__ import annotations

import math

import numpy as np

from rollcap.rollout.stats import mcnemar_p, wilson

VALIDATION, TEST = 1, 2
"""Seed streams of :func:`stream_seeds`."""


def stream_seeds(seed: int, stream: int, n: int) -> list[int]:
    """``n`` 63-bit episode seeds of stream ``stream`` under iteration seed ``seed``."""
    out = []
    for i in range(n):
        ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(0x2EC4, int(stream), i))
        out.append(int(ss.generate_state(2, np.uint32).view(np.uint64)[0] >> np.uint64(1)))
    return out


def check_disjoint(seeds: list[int], used: set[int], what: str) -> None:
    """Refuse ``seeds`` that share one with ``used`` (the collected and demonstration seeds).

    Raises:
        ConfigError: naming ``seed`` (the iteration seed the streams derive from).
    """
    from rollcap.rollout.errors import ConfigError

    both = sorted(set(seeds) & used)
    if both:
        raise ConfigError(
            "seed", f"{what} seeds overlap the collected episodes ({len(both)}, e.g. {both[0]}); use another `seed`"
        )


def env_list(env) -> list[tuple[str, dict]]:
    """``(env id, kwargs)``, a list of them, or None (the built-in task) as a list of ``(env id, kwargs)``."""
    from rollcap.rollout.spec import DEFAULT_ENV

    if env is None:
        return [(DEFAULT_ENV, {})]
    if isinstance(env, tuple) and len(env) == 2 and isinstance(env[0], str):
        return [env]
    return [(str(e), dict(kw or {})) for e, kw in env]


def successes(model, seeds: list[int], execute_steps: int, env=None, threads: int = 1) -> np.ndarray:
    """Did ``model`` (a FlowVLA) solve each seed with ``execute_steps`` actions per chunk: bool ``[len(envs) * len(seeds)]``.

    ``env``: ``(env id, kwargs)`` or a list of them (:func:`env_list`; default: the built-in task); every env runs
    every seed, env by env, each on a host of its own.
    """
    from rollcap.kernels.lanes import make_lane
    from rollcap.rollout.build import make_env, policy_runner
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    out: list[bool] = []
    for env_id, kwargs in env_list(env):
        runner = policy_runner(model, lane=make_lane("policy", "cpu", threads))
        host = RolloutHost(
            make_env(env_id, kwargs), runner, None, HostConfig(execute_steps=execute_steps), records=False
        )
        try:
            out += [host.run_episode(i, s).success for i, s in enumerate(seeds)]
        finally:
            host.close()
    return np.array(out, bool)


def paired(before: np.ndarray, after: np.ndarray) -> dict:
    """Success before / after on the same seeds: rates with Wilson intervals, the paired difference, McNemar."""
    before, after = np.asarray(before, bool), np.asarray(after, bool)
    n = len(before)
    d = after.astype(float) - before.astype(float)
    half = 1.96 * d.std(ddof=1) / math.sqrt(n) if n > 1 else float("inf")
    fixed, broken = int((after & ~before).sum()), int((before & ~after).sum())
    return {
        "episodes": n,
        "before": {"successes": int(before.sum()), "rate_ci": wilson(int(before.sum()), n)},
        "after": {"successes": int(after.sum()), "rate_ci": wilson(int(after.sum()), n)},
        "difference_ci": (float(d.mean()), float(d.mean() - half), float(d.mean() + half)),
        "fixed": fixed,
        "broken": broken,
        "mcnemar_p": mcnemar_p(fixed, broken),
        "failure_rate_ratio": float((~after).sum() / (~before).sum()) if (~before).any() else float("nan"),
    }


def evaluate(
    before, after, seeds: list[int], execute_steps: tuple[int, ...], env=None, threads: int = 1, log=lambda line: None
) -> dict:
    """Stage 5: ``before`` and ``after`` (FlowVLA models) on ``seeds`` at each ``execute_steps`` in each env of ``env``
    (:func:`env_list`); :func:`paired` per setting over every (env, seed), and per env when there are several."""
    envs = env_list(env)
    out = {}
    for s in execute_steps:
        b = successes(before, seeds, s, envs, threads)
        a = successes(after, seeds, s, envs, threads)
        res = paired(b, a)
        res["outcomes"] = {"before": b.astype(int).tolist(), "after": a.astype(int).tolist()}
        if len(envs) > 1:
            n = len(seeds)
            res["per_env"] = {
                e: {k: v for k, v in paired(b[i * n : (i + 1) * n], a[i * n : (i + 1) * n]).items()}
                for i, (e, _) in enumerate(envs)
            }
        out[str(s)] = res
        log(f"evaluate: execute_steps {s}: before {b.mean():.1%}, after {a.mean():.1%} over {len(seeds)} held-out seeds x {len(envs)} env(s); "
            f"fixed {res['fixed']}, broken {res['broken']}, McNemar p {res['mcnemar_p']:.3g}")  # fmt: skip
    return out
