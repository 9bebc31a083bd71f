"""An env's control period: the simulated seconds one ``env.step`` covers.

Gymnasium's convention is the env's ``dt`` (its MuJoCo envs: timestep x
frame_skip; MetaWorld: 0.0125 s, 80 Hz; gymnasium-robotics' Fetch: 0.04 s;
the built-in task: 0.1 s, 10 Hz). Recordings keep it
(``EpisodeRecord.control_period_s``) so an export says at what rate its
frames were taken.
"""

from __future__ import annotations

import math


def control_period(env) -> float | None:
    """``env.unwrapped.dt`` as a float when it is a finite number > 0, else None (the env does not say)."""
    dt = getattr(getattr(env, "unwrapped", env), "dt", None)
    if isinstance(dt, bool):
        return None
    try:
        dt = float(dt)
    except (TypeError, ValueError):
        return None
    return dt if math.isfinite(dt) and dt > 0 else None


def frames_per_second(period: float) -> int | None:
    """The whole number of steps per second a period of ``period`` seconds makes (0.0125 -> 80), None when it is not whole."""
    fps = round(1.0 / period)
    return fps if fps >= 1 and abs(fps * period - 1.0) < 1e-6 else None
