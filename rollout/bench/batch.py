"""``rollcap bench --only batch``: many envs on one policy graph (issue 34), side by side in one run.

- ``rollcap.run(envs=N)`` vs ``envs=1``: episodes/s of recorded runs (npz +
  HDF5, the background writer) with the shipped policy and critic, interleaved
  rounds, the same episodes each time; wall from the first episode to the last
  written (start-up and capture excluded). Goal: ``envs=8`` >= 2.5x ``envs=1``.
  Beside it, episodes per CPU second of this process (every thread), which a
  shared, busy machine disturbs less than wall time.
- the vector env: :class:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv`
  with N sub-envs vs gymnasium's ``AsyncVectorEnv`` of 2 ``NoiseSteeringEnv``
  workers (each its own process and batch-1 graphs), sub-env chunks/s. Goal >= 2x.

Only for the built-in task with checkpoint models (the vector env's task); another ``--env`` / policy is refused.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from rollcap.rollout.build import DEFAULT_ENV, Parts, named_policy
from rollcap.rollout.protocols import Subscriber

ENVS = 8
"""The batch compared with 1."""


class _CpuClock(Subscriber):
    """This process's CPU seconds (every thread: lanes, env pool, writer) from the first episode's start to the run's end."""

    def __init__(self):
        self.t0 = self.t1 = None

    def on_episode_start(self, start) -> None:
        if self.t0 is None:
            self.t0 = time.process_time()

    def on_run_end(self) -> None:
        self.t1 = time.process_time()


def _run_rate(parts: Parts, envs: int, episodes: int, out: Path) -> dict:
    from rollcap.rollout.api import run

    cpu = _CpuClock()
    r = run(
        episodes, out=out, env=parts.env_id, policy=parts.policy, critic=parts.critic or "none", envs=envs, progress=False,
        env_kwargs=parts.env_kwargs, device=parts.device, backend=parts.backend, threads=parts.threads, subscribers=(cpu,),
    )  # fmt: skip
    s = r.summary
    return {"episodes_per_s": s["episodes"] / s["wall_s"], "episodes_per_cpu_s": s["episodes"] / (cpu.t1 - cpu.t0), "chunks_per_s": s["chunks"] / s["wall_s"], "wall_s": s["wall_s"]}


def _vector_rate(parts: Parts, envs: int, chunks: int) -> float:
    """Sub-env chunks/s of the batched NoiseSteeringVectorEnv with ``envs`` sub-envs."""
    from rollcap.rollout.gym.vector import make_noise_steering_vector_env

    env = make_noise_steering_vector_env(envs, parts.env_kwargs, parts.device, threads=parts.threads)
    try:
        env.reset(seed=0)
        noise = np.random.default_rng(0).standard_normal((chunks, envs, *env.chunk_shape)).astype(np.float32)
        env.step(noise[0])  # warm
        t0 = time.perf_counter()
        for a in noise[1:]:
            env.step(a)
        return (chunks - 1) * envs / (time.perf_counter() - t0)
    finally:
        env.close()


def bench_batch(parts: Parts, n: int) -> dict:
    if parts.env_id != DEFAULT_ENV or parts.env_kwargs or named_policy(parts.policy) is not None:
        raise ValueError("--only batch: measured on the built-in task with checkpoint models (not --env / --env-kwargs / a named --policy)")
    from rollcap.rollout.bench.gym import _vector_rate as async_rate

    quick = n < 100
    episodes, rounds = (8, 1) if quick else (24, 3)
    rates: dict[int, list[dict]] = {1: [], ENVS: []}
    with tempfile.TemporaryDirectory(prefix="rollcap-bench-batch-") as tmp:
        for k in range(rounds):  # interleaved: 1, N, 1, N
            for envs in rates:
                rates[envs].append(_run_rate(parts, envs, episodes, Path(tmp) / f"r{k}-{envs}"))
    out = {"episodes": episodes, "rounds": rounds, "envs": ENVS}
    for envs, rs in rates.items():
        for key in ("episodes_per_s", "episodes_per_cpu_s", "chunks_per_s"):
            out[f"envs_{envs}_{key}"] = [r[key] for r in rs]
    out["speedup"] = [b["episodes_per_s"] / a["episodes_per_s"] for a, b in zip(rates[1], rates[ENVS])]
    out["speedup_per_cpu_s"] = [b["episodes_per_cpu_s"] / a["episodes_per_cpu_s"] for a, b in zip(rates[1], rates[ENVS])]
    chunks = 8 if quick else 40
    out["vector_chunks_per_s"] = _vector_rate(parts, ENVS, chunks)
    out["async_2_chunks_per_s"] = async_rate(parts, 2, chunks)
    out["vector_over_async_2"] = out["vector_chunks_per_s"] / out["async_2_chunks_per_s"]
    return out


def format_batch(b: dict, row) -> None:
    def fmt(xs):
        return " / ".join(f"{x:.2f}" for x in xs)

    row(f"run episodes/s, envs=1 ({b['episodes']} episodes, {b['rounds']} round(s))", fmt(b["envs_1_episodes_per_s"]))
    row(f"run episodes/s, envs={b['envs']}", fmt(b[f"envs_{b['envs']}_episodes_per_s"]))
    row(f"envs={b['envs']} / envs=1 (goal >= 2.5x)", " / ".join(f"{x:.2f}x" for x in b["speedup"]))
    row("  the same per CPU second of this process", " / ".join(f"{x:.2f}x" for x in b["speedup_per_cpu_s"]))
    row(f"chunks/s: vector env ({b['envs']} sub-envs) / AsyncVectorEnv(2)", f"{b['vector_chunks_per_s']:.1f} / {b['async_2_chunks_per_s']:.1f} ({b['vector_over_async_2']:.2f}x, goal >= 2x)")
