"""Timing helpers the benchmark sections share: repeated calls, medians and p99 in milliseconds."""

from __future__ import annotations

import time

import numpy as np

from rollcap.rollout.build import Parts, make_env


def stats(xs: list[float]) -> dict:
    a = np.asarray(xs) * 1e3
    return {"median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)), "n": len(xs)}


def time_calls(fn, n: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def step_times(env, actions) -> list[float]:
    """Seconds of each ``env.step(a)`` for ``actions`` (gymnasium envs); a terminated or truncated episode is reset, untimed."""
    times = []
    for a in actions:
        t0 = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(a)
        times.append(time.perf_counter() - t0)
        if terminated or truncated:
            env.reset()
    return times


def sample_obs(parts: Parts):
    env = make_env(parts.env_id, parts.env_kwargs)
    obs, _ = env.reset(seed=0)
    env.close()
    return obs
