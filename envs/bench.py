"""Throughput of ``rollcap/PushBlock-v0`` on one thread (for ``rollcap bench``)."""

from __future__ import annotations

import time

import mujoco
import numpy as np

from rollcap.envs.push_block import ENV_ID, PushBlockEnv


def _steps_per_s(env: PushBlockEnv, steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.0, 1.0, size=(steps, 2)).astype(np.float32)
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - t0)


def bench_env(steps: int = 2000, image_size: int = 64, seed: int = 0) -> dict:
    """Measure env steps/s with and without images, and the numpy render time.

    Random uniform actions, auto-reset included in the timing; everything
    runs on the calling thread (MuJoCo and the numpy renderer are
    single-threaded).

    Returns:
        A JSON-able dict: ``env_id``, ``steps``, ``image_size``,
        ``steps_per_s_no_images``, ``steps_per_s_images``,
        ``render_ms_per_frame``, ``mujoco``, ``numpy``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    plain = PushBlockEnv(render_images=False)
    with_images = PushBlockEnv(image_size=image_size)
    try:
        no_img = _steps_per_s(plain, steps, seed)
        img = _steps_per_s(with_images, steps, seed)
        renderer = with_images._image_renderers["front"]
        qpos = with_images.data.qpos.copy()
        t0 = time.perf_counter()
        for _ in range(steps):
            renderer.render(qpos)
        render_ms = (time.perf_counter() - t0) / steps * 1e3
    finally:
        plain.close()
        with_images.close()
    return {
        "env_id": ENV_ID,
        "steps": steps,
        "image_size": image_size,
        "steps_per_s_no_images": round(no_img, 1),
        "steps_per_s_images": round(img, 1),
        "render_ms_per_frame": round(render_ms, 4),
        "mujoco": mujoco.__version__,
        "numpy": np.__version__,
    }
