"""Bench section ``env``: env steps per second on one core, of ``--env`` (default: the built-in task, :mod:`rollcap.envs.bench`).

Another env (``rollcap bench --env rollcap/MetaWorld-push-v3``) is built as
``rollcap run`` builds it (``--env-kwargs`` included) and stepped with seeded
random actions from its action space, auto-reset included. An env that takes
``render_images`` (the built-in task, MetaWorld) is measured both ways, and the
images' cost is the difference of the two step times (its renderer's cost per
observation, every camera). Images need ``MUJOCO_GL=egl`` or ``osmesa`` (the section runs
on a worker thread, where glfw aborts the process); without one the row says why.
"""

from __future__ import annotations

import time

import numpy as np

from rollcap.kernels.lanes import CpuLane
from rollcap.rollout.bench.timing import step_times
from rollcap.rollout.spec import DEFAULT_ENV, Parts
from rollcap.rollout.build import make_env
from rollcap.rollout.errors import ConfigError


def bench_env(parts: Parts, n: int) -> dict:
    from rollcap.envs.bench import bench_env as _bench

    lane = CpuLane("env-bench", threads=1)  # one core, as the issue asks
    try:
        if parts.env_id == DEFAULT_ENV and not parts.env_kwargs:
            return lane.run(_bench, max(200, n * 10))
        return lane.run(bench_named_env, parts.env_id, parts.env_kwargs or {}, max(200, n * 10), max(20, n))
    finally:
        lane.close()


def _step_ms(env, steps: int, seed: int) -> tuple[float, float]:
    """Median and mean ms per ``env.step`` over ``steps`` seeded random actions (resets not timed)."""
    space = env.action_space
    space.seed(seed)
    actions = [space.sample() for _ in range(steps)]
    env.reset(seed=seed)
    env.step(actions[0])  # first-use costs (a renderer's GL context) are not a step's
    times = step_times(env, actions)
    return float(np.median(times) * 1e3), float(np.mean(times) * 1e3)


def bench_named_env(env_id: str, env_kwargs: dict, steps: int, image_steps: int, seed: int = 0) -> dict:
    """ms per step of ``env_id`` without and with images when it takes ``render_images``, else as configured.

    Returns:
        A JSON-able dict: ``env_id``, ``env_kwargs``, ``steps``, ``make_env_s``; for an env with
        ``render_images``: ``no_images_step_ms_median`` / ``_mean`` (``steps`` steps), ``images_step_ms_*``
        (``image_steps`` steps; the other ``--env-kwargs`` kept: ``image_size``, ``cameras``),
        ``image_ms_per_obs`` (the difference of the medians) or ``images_skipped`` (why); else
        ``step_ms_median`` / ``_mean``.
    """
    import os

    import mujoco

    out: dict = {"env_id": env_id, "env_kwargs": dict(env_kwargs), "steps": steps, "mujoco": mujoco.__version__}
    t0 = time.perf_counter()
    try:
        plain = make_env(env_id, {**env_kwargs, "render_images": False})
    except ConfigError:  # no render_images option: the env as configured
        env = make_env(env_id, env_kwargs)
        try:
            out["step_ms_median"], out["step_ms_mean"] = _step_ms(env, steps, seed)
        finally:
            env.close()
        return out | {"images_skipped": "the env takes no render_images option"}
    out["make_env_s"] = round(time.perf_counter() - t0, 3)
    try:
        out["no_images_step_ms_median"], out["no_images_step_ms_mean"] = _step_ms(plain, steps, seed)
    finally:
        plain.close()
    out["mujoco_gl"] = gl = os.environ.get("MUJOCO_GL", "")
    if gl not in ("egl", "osmesa"):  # glfw on the lane's thread aborts the process (libc++abi), it raises nothing
        return out | {"images_skipped": f"MUJOCO_GL={gl or '<unset>'}: set MUJOCO_GL=egl or osmesa to measure images"}
    try:
        drawn = make_env(env_id, {**env_kwargs, "render_images": True})
        try:
            out["images_step_ms_median"], out["images_step_ms_mean"] = _step_ms(drawn, image_steps, seed)
        finally:
            drawn.close()
    except Exception as err:  # no GL here (MUJOCO_GL unset, no EGL / OSMesa): the figure is missing, and why
        return out | {"images_skipped": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    out["image_steps"] = image_steps
    out["image_ms_per_obs"] = out["images_step_ms_median"] - out["no_images_step_ms_median"]
    return out


def format_env(e: dict, row) -> None:
    """The section's rows of the human table."""
    for k, v in e.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            row(k, f"{v:.4g}")
        elif k in ("env_id", "images_skipped", "mujoco_gl") or (k == "env_kwargs" and v):
            row(k, str(v))
