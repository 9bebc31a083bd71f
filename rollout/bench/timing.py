"""Timing helpers the benchmark sections share: repeated calls, medians and p99 in milliseconds; spreads over rounds and
how a wall-clock figure is printed with them and with the machine's load.

A figure from rounds of wall-clock runs is printed as its median with the range over rounds; a cost whose range
straddles zero is "within noise", never "-0.0%"; one round has no range, and says so; a section that ran while the
machine was busy (a 1-minute load average above half its cores) marks its figures with that load.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env


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


def spread(xs) -> dict:
    """``median``, ``min``, ``max`` and ``n`` of per-round figures."""
    xs = list(xs)
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def load_now() -> dict:
    """The machine's 1-minute load average and its cores, for a section's ``load``."""
    return {"load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"), "cpus": os.cpu_count() or 1}


def load_note(load: dict | None) -> str:
    """``"; noisy: load 8.6 on 2 cpus"`` when the section ran on a busy machine (load above half its cores), else ``""``."""
    if not load or not load.get("load", 0) > load["cpus"] / 2:
        return ""
    return f"; noisy: load {load['load']:.1f} on {load['cpus']} cpus"


def _pct(x: float) -> str:
    text = f"{x:.1%}"
    return "0.0%" if text == "-0.0%" else text


def cost_text(s: dict, load: dict | None = None) -> str:
    """A cost over rounds (a fraction of a wall): ``12.3% (10.1% to 14.0% over 3 rounds)``; ``within noise`` when its range
    holds zero; one round says it has no range."""
    n = s.get("n", 0)
    if n == 1:
        return f"{_pct(s['median'])} (1 round: no spread{load_note(load)})"
    if s["min"] <= 0 <= s["max"]:
        return f"within noise ({_pct(s['min'])} to {_pct(s['max'])} over {n} rounds{load_note(load)})"
    return f"{_pct(s['median'])} ({_pct(s['min'])} to {_pct(s['max'])} over {n} rounds{load_note(load)})"


def ratio_text(s: dict, load: dict | None = None) -> str:
    """A ratio over rounds: ``1.16x (1.11-1.22 over 2 rounds)``, with the load when the machine was busy."""
    n = s.get("n", 0)
    over = "1 round: no spread" if n == 1 else f"{s['min']:.2f}-{s['max']:.2f} over {n} rounds"
    return f"{s['median']:.2f}x ({over}{load_note(load)})"
