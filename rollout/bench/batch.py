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

N is 8 on CPU, 32 on CUDA. On CPU the batched run and the vector env are also
measured split over one graph a core (``--graphs``, each at batch N/G on its own
lanes): their replays run side by side, where one graph leaves the second core
to the critic alone.

Only for the built-in task with checkpoint models (the vector env's task); another ``--env`` / policy is refused.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

from rollcap.rollout.build import DEFAULT_ENV, Parts, named_policy
from rollcap.rollout.protocols import Subscriber

ENVS = {"cpu": 8, "cuda": 32}
"""The batch compared with 1, per device type (the issue's goals: 2.5x at 8 on this CPU, 10x at 32 on one GPU)."""
WRITERS = {"cpu": 0, "cuda": 2}
"""Recording processes of every run (``RunConfig.writers``): on a GPU box one writer thread caps a run near 34 episodes/s."""


class _CpuClock(Subscriber):
    """This process's CPU seconds (every thread: lanes, env pool, writer) from the first episode's start to the run's end."""

    def __init__(self):
        self.t0 = self.t1 = None

    def on_episode_start(self, start) -> None:
        if self.t0 is None:
            self.t0 = time.process_time()

    def on_run_end(self) -> None:
        self.t1 = time.process_time()


def _run_rate(parts: Parts, envs: int, episodes: int, out: Path, graphs: int = 1, writers: int = 0) -> dict:
    from rollcap.rollout.api import run

    cpu = _CpuClock()
    r = run(
        episodes, out=out, env=parts.env_id, policy=parts.policy, critic=parts.critic or "none", envs=envs, progress=False,
        env_kwargs=parts.env_kwargs, device=parts.device, backend=parts.backend, threads=parts.threads, graphs=graphs, writers=writers, subscribers=(cpu,),
    )  # fmt: skip
    s = r.summary
    return {
        "episodes_per_s": s["episodes"] / s["wall_s"],
        "episodes_per_cpu_s": s["episodes"] / (cpu.t1 - cpu.t0),
        "chunks_per_s": s["chunks"] / s["wall_s"],
        "wall_s": s["wall_s"],
    }


def _vector_rate(parts: Parts, envs: int, chunks: int, graphs: int = 1) -> float:
    """Sub-env chunks/s of the batched NoiseSteeringVectorEnv with ``envs`` sub-envs."""
    from rollcap.rollout.gym.vector import make_noise_steering_vector_env

    env = make_noise_steering_vector_env(envs, parts.env_kwargs, parts.device, threads=parts.threads, graphs=graphs)
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
        from rollcap.rollout.errors import ConfigError

        raise ConfigError(
            "env_kwargs" if parts.env_kwargs else "env_id" if parts.env_id != DEFAULT_ENV else "policy",
            "section batch is measured on the built-in task with checkpoint models; pick other sections with --only",
        )

    import torch

    from rollcap.rollout.bench.gym import _vector_rate as async_rate

    n_envs = ENVS[torch.device(parts.device).type]
    graphs = (
        1 if parts.device != "cpu" else max(2, min(os.cpu_count() or 1, n_envs))
    )  # CPU: one graph a core, side by side
    quick = n < 100
    kind = torch.device(parts.device).type
    writers = WRITERS[kind]
    episodes, rounds = (
        (8, 1) if quick else (64 if kind == "cpu" else 256, 2)
    )  # a GPU's batch of 32: 8 waves of episodes
    configs = {"envs_1": (1, 1), f"envs_{n_envs}": (n_envs, 1)}
    if graphs > 1:
        configs[f"envs_{n_envs}_graphs_{graphs}"] = (n_envs, graphs)
    rates: dict[str, list[dict]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="rollcap-bench-batch-") as tmp:
        for k in range(rounds):  # interleaved rounds: every configuration once per round
            for name, (envs, g) in configs.items():
                rates[name].append(_run_rate(parts, envs, episodes, Path(tmp) / f"r{k}-{name}", g, writers))
    out = {
        "episodes": episodes,
        "rounds": rounds,
        "envs": n_envs,
        "graphs": graphs,
        "writers": writers,
        "configs": list(configs),
    }
    for name, rs in rates.items():
        for key in ("episodes_per_s", "episodes_per_cpu_s", "chunks_per_s"):
            out[f"{name}_{key}"] = [r[key] for r in rs]
        if name != "envs_1":
            out[f"{name}_speedup"] = [b["episodes_per_s"] / a["episodes_per_s"] for a, b in zip(rates["envs_1"], rs)]
            out[f"{name}_speedup_per_cpu_s"] = [
                b["episodes_per_cpu_s"] / a["episodes_per_cpu_s"] for a, b in zip(rates["envs_1"], rs)
            ]
    chunks = 8 if quick else 40
    out["async_2_chunks_per_s"] = async_rate(parts, 2, chunks)
    out["vector_chunks_per_s"] = _vector_rate(parts, n_envs, chunks)
    out["vector_graphs_chunks_per_s"] = (
        _vector_rate(parts, n_envs, chunks, graphs) if graphs > 1 else out["vector_chunks_per_s"]
    )
    out["vector_over_async_2"] = out["vector_chunks_per_s"] / out["async_2_chunks_per_s"]
    out["vector_graphs_over_async_2"] = out["vector_graphs_chunks_per_s"] / out["async_2_chunks_per_s"]
    return out


def format_batch(b: dict, row) -> None:
    def fmt(xs, unit=""):
        return " / ".join(f"{x:.2f}{unit}" for x in xs)

    row(
        f"({b['episodes']} episodes a run, {b['rounds']} interleaved round(s), {b.get('writers') or 'a thread'} writer{'s' if b.get('writers', 0) > 1 else ''})"
    )
    for name in b["configs"]:
        row(f"run episodes/s, {name}", fmt(b[f"{name}_episodes_per_s"]))
        if name != "envs_1":
            row("  over envs_1 (goal >= 2.5x at 8 on CPU)", fmt(b[f"{name}_speedup"], "x"))
            row("  the same per CPU second of this process", fmt(b[f"{name}_speedup_per_cpu_s"], "x"))
    row(
        f"chunks/s: AsyncVectorEnv(2) / vector env ({b['envs']} sub-envs)",
        f"{b['async_2_chunks_per_s']:.1f} / {b['vector_chunks_per_s']:.1f} ({b['vector_over_async_2']:.2f}x, goal >= 2x)",
    )
    row(
        f"  the vector env on {b['graphs']} graphs",
        f"{b['vector_graphs_chunks_per_s']:.1f} ({b['vector_graphs_over_async_2']:.2f}x)",
    )
