"""Bench section ``env``: env steps per second on one core (:mod:`rollcap.envs.bench`)."""

from __future__ import annotations

from rollcap.kernels.lanes import CpuLane
from rollcap.rollout.build import Parts


def bench_env(parts: Parts, n: int) -> dict:
    from rollcap.envs.bench import bench_env as _bench

    lane = CpuLane("env-bench", threads=1)  # one core, as the issue asks
    try:
        return lane.run(_bench, max(200, n * 10))
    finally:
        lane.close()


def format_env(e: dict, row) -> None:
    """The section's rows of the human table."""
    for k, v in e.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            row(k, f"{v:.4g}")
