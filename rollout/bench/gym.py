"""``rollcap bench --only gym``: the gymnasium envs' cost over the episode core, and vectorized throughput.

- ``ChunkEnv.step`` vs driving the same host directly (``execute(chunk)`` +
  the next ``boundary``, as the env's step does) for the same chunks and
  episodes, interleaved; the goal is a ratio <= 1.05.
- ``AsyncVectorEnv`` of 2 ``NoiseSteeringEnv`` workers vs one env in this
  process, in chunks per second (each worker builds its own runners; on a
  2-core machine the two workers and their lanes share the cores). Only for
  the built-in task and a checkpoint policy (the env it steers); skipped, saying so, with another.
"""

from __future__ import annotations

import time

import numpy as np

from rollcap.rollout.bench.timing import load_note, step_times
from rollcap.rollout.spec import DEFAULT_ENV, Parts, named_policy
from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.gym.envs import ChunkEnv, make_noise_steering_env
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.seeding import episode_seed


def _chunks(n: int, shape: tuple[int, int]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(n)]


def _through_env(env: ChunkEnv, chunks: list[np.ndarray], seed: int) -> list[float]:
    env.reset(seed=seed)
    return step_times(env, chunks)


def _through_core(env: ChunkEnv, chunks: list[np.ndarray], seed: int) -> list[float]:
    """The same work as ``ChunkEnv.step`` on the host itself: the chunk's ``execute_steps`` rows, then the next boundary
    (an episode's first boundary at its start, untimed, as the env's reset runs it)."""
    host, times, episode, e = env.host, [], 0, env.execute_steps

    def start() -> None:
        host.start(episode, episode_seed(seed, episode))
        host.boundary()

    if host.state is not HostState.RESET:
        host.finish("bench")
    start()
    for c in chunks:
        t0 = time.perf_counter()
        if not host.done:
            host.execute(c[:e])
        if not host.done:
            host.boundary()
        if host.done:
            host.finish()
        times.append(time.perf_counter() - t0)
        if host.state is HostState.RESET:
            episode += 1
            start()
    host.finish("bench")
    return times


def _vector_rate(parts: Parts, workers: int, chunks: int) -> float:
    """Sub-env chunks per second of an AsyncVectorEnv (``workers`` > 1) or of one env in this process."""
    import gymnasium as gym

    def make():
        return make_noise_steering_env(parts.env_kwargs, parts.device)

    env = gym.vector.AsyncVectorEnv([make] * workers, context="spawn") if workers > 1 else make()
    try:
        env.reset(seed=list(range(workers)) if workers > 1 else 0)
        shape = (workers, 8, 2) if workers > 1 else (8, 2)
        noise = np.random.default_rng(0).standard_normal((chunks, *shape)).astype(np.float32)
        env.step(noise[0])  # warm
        t0 = time.perf_counter()
        for a in noise[1:]:
            _, _, term, trunc, _ = env.step(a)
            if workers == 1 and (term or trunc):
                env.reset()
        return (chunks - 1) * workers / (time.perf_counter() - t0)
    finally:
        env.close()


def bench_gym(parts: Parts, n: int) -> dict:
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    chunk_env = ChunkEnv(env, policy, critic, HostConfig(seed=7))
    chunks = _chunks(max(40, n // 2), chunk_env.chunk_shape)
    via_env, via_core = [], []
    try:
        for rep in range(3):  # interleaved, same chunks and episodes
            via_env += _through_env(chunk_env, chunks, rep)
            via_core += _through_core(chunk_env, chunks, rep)
    finally:
        chunk_env.close()
    out = {
        "chunks": len(via_env),
        "chunk_env_step_ms": float(np.median(via_env) * 1e3),
        "core_boundary_execute_ms": float(np.median(via_core) * 1e3),
    }
    out["chunk_env_over_core"] = out["chunk_env_step_ms"] / out["core_boundary_execute_ms"]
    if parts.env_id != DEFAULT_ENV or named_policy(parts.policy) is not None:
        out["vector_skipped"] = (
            "NoiseSteerPushBlock-v0 is the built-in task with a checkpoint policy, not --env / --policy"
        )
        return out
    k = max(10, n // 10)
    out["single_env_chunks_per_s"] = _vector_rate(parts, 1, k)
    out["async_2_workers_chunks_per_s"] = _vector_rate(parts, 2, k)
    out["async_2_over_single"] = out["async_2_workers_chunks_per_s"] / out["single_env_chunks_per_s"]
    return out


def format_gym(g: dict, row) -> None:
    row(
        "ChunkEnv.step vs host execute+boundary",
        f"{g['chunk_env_step_ms']:.2f} vs {g['core_boundary_execute_ms']:.2f} ms ({g['chunk_env_over_core']:.3f}x, {g['chunks']} chunks)",
    )
    if "vector_skipped" in g:
        row("chunks/s: 1 env / AsyncVectorEnv(2 workers)", f"skipped: {g['vector_skipped']}")
        return
    row(
        "chunks/s: 1 env / AsyncVectorEnv(2 workers)",
        f"{g['single_env_chunks_per_s']:.1f} / {g['async_2_workers_chunks_per_s']:.1f} ({g['async_2_over_single']:.2f}x{load_note(g.get('load'))})",
    )
