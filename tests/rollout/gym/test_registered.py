"""The registered ids as an RL user reaches them (issue 45): gymnasium's and SB3's checkers, make_vec in every
vectorization mode (async with the default start method included), no thread left after close."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.errors import ConfigError

RL_IDS = ("rollcap/ChunkPushBlock-v0", "rollcap/NoiseSteerPushBlock-v0")


def _quiet_check(env) -> list[str]:
    """gymnasium's check_env (render modes included); returns its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    return [str(w.message) for w in caught]


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("env_id", ["rollcap/PushBlock-v0", *RL_IDS])
def test_gymnasium_check_env_passes_with_render_modes(env_id):
    """Every rollcap id passes gymnasium's check_env, its declared render modes made and rendered too."""
    env = gym.make(env_id)
    try:
        assert env.metadata["render_modes"] == ["rgb_array"]
        _quiet_check(env)
    finally:
        env.close()


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize(
    "env_id, kw", [(RL_IDS[0], {}), (RL_IDS[1], {}), (RL_IDS[1], {"state_only": True, "noise_bound": 1.5})]
)
def test_sb3_check_env_passes(env_id, kw):
    """SB3's check_env passes on the RL ids (the noise env's box draws only SB3's advice to normalise it, the chunk env's
    (H, A) policy_chunk only its advice to flatten it)."""
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    env = gym.make(env_id, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_checker.check_env(env, warn=True)
    env.close()
    messages = [str(w.message) for w in caught]
    # advice only: the noise box is not [-1, 1]; the chunk env's policy_chunk is (H, A), the action's shape
    advice = (
        "symmetric and normalized Box action space" if "Noise" in env_id else "policy_chunk has an unconventional shape"
    )
    assert all(advice in m for m in messages) and len(messages) == 1, messages


@pytest.mark.slow(seconds=30)
def test_every_metaworld_id_passes_gymnasium_check_env():
    """The 50 MetaWorld ids pass check_env: their metadata lists only the render modes make takes."""
    pytest.importorskip("metaworld", reason="pip install --no-deps metaworld==3.1.1")
    from rollcap.envs.metaworld import TASKS

    for task in TASKS:
        env = gym.make(f"rollcap/MetaWorld-{task}", render_images=False)
        try:
            assert env.metadata["render_modes"] == []
            _quiet_check(env)
        finally:
            env.close()
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        gym.make("rollcap/MetaWorld-push-v3", render_mode="human")


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("cls", ["ChunkEnv", "NoiseSteeringEnv"])
def test_metaworld_through_the_rl_envs_passes_both_checkers(cls):
    """SB3 refuses the task ids' text instruction; through ChunkEnv / NoiseSteeringEnv (a tiny state-only policy, no
    critic: step info has no NaN value, which failed gymnasium's determinism check) both checkers pass."""
    pytest.importorskip("metaworld", reason="pip install --no-deps metaworld==3.1.1")
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    import torch

    from rollcap.policies import FlowVLA, FlowVLAConfig, PolicyRunner
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.gym import envs

    cfg = FlowVLAConfig(image_keys=(), image_size=32, patch_size=16, state_dim=39, action_dim=4, state_group=0,
                        max_tokens=64, width=32, depth=1, heads=2, num_steps=2, horizon=4, execute_steps=4)  # fmt: skip
    torch.manual_seed(0)
    task = gym.make("rollcap/MetaWorld-push-v3", render_images=False)
    env = getattr(envs, cls)(task, PolicyRunner(FlowVLA(cfg).eval()), None, HostConfig(max_chunks=3))
    try:
        _quiet_check(env)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sb3_checker.check_env(env, warn=True)
        advice = ("symmetric and normalized Box", "policy_chunk has an unconventional shape")  # advice, no fault
        assert all(any(a in str(w.message) for a in advice) for w in caught), [str(w.message) for w in caught]
    finally:
        env.close()


_METAWORLD_RENDER = """
import warnings, gymnasium as gym, numpy as np, rollcap.envs
from gymnasium.utils.env_checker import check_env
warnings.simplefilter("ignore")
env = gym.make("rollcap/MetaWorld-push-v3", image_size=32, render_mode="rgb_array")
check_env(env)
obs, _ = env.reset(seed=0)
assert env.metadata == {"render_modes": ["rgb_array"], "render_fps": 80}, env.metadata
assert np.array_equal(env.render(), obs["image_corner"])
print("ok")
"""


@pytest.mark.slow(seconds=30)
def test_metaworld_with_images_renders_what_the_policy_sees():
    """With images, a MetaWorld id takes render_mode='rgb_array' (the first camera's image) and passes check_env."""
    pytest.importorskip("metaworld", reason="pip install --no-deps metaworld==3.1.1")
    from tests.envs.test_metaworld import _gl

    gl = _gl()
    if gl is None:
        pytest.skip("no headless GL here (MUJOCO_GL=egl needs libegl1 + libegl-mesa0, osmesa needs libosmesa6)")
    out = subprocess.run(
        [sys.executable, "-c", _METAWORLD_RENDER],
        env={**os.environ, "MUJOCO_GL": gl},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_make_vec_with_no_sub_envs_is_refused_in_one_line():
    """num_envs=0 names the argument (it was an IndexError from inside the vector env)."""
    with pytest.raises(ConfigError, match=r"^num_envs: expected an integer >= 1, got 0$"):
        gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs=0)


@pytest.mark.slow(seconds=40)
def test_make_close_cycles_leave_no_thread():
    """Made and closed three times (single and vector): the lane threads go with the env (they leaked 2 an env)."""
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        env = gym.make("rollcap/NoiseSteerPushBlock-v0")
        env.reset(seed=0)
        env.close()
        venv = gym.make_vec("rollcap/ChunkPushBlock-v0", num_envs=2)
        venv.reset(seed=0)
        venv.step(np.zeros(venv.action_space.shape, np.float32))
        venv.close()
    left = [t.name for t in threading.enumerate() if t.ident not in before]
    assert left == [], left


_ASYNC = """
import sys, gymnasium as gym, numpy as np, rollcap
mode = sys.argv[1]
env = gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs=2, vectorization_mode=mode)
obs, info = env.reset(seed=3)
_, r, *_ = env.step(np.zeros(env.action_space.shape, np.float32))
env.close()
print("ok", mode, obs["state"][0].tobytes() != obs["state"][1].tobytes(), r.tolist())
"""


@pytest.mark.slow(seconds=60)
def test_async_make_vec_works_with_the_default_start_method():
    """make_vec(..., vectorization_mode="async") with Linux's default fork: the parent builds one env (torch's
    threads started) then forks; a worker's first weight copy hung on a barrier forever. It must finish."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _ASYNC, "async"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a hung run is killed with its workers
    )
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("make_vec(vectorization_mode='async') hung with the default start method")
    assert proc.returncode == 0 and out.startswith("ok async True"), err[-2000:]


@pytest.mark.slow(seconds=20)
def test_sync_make_vec_sub_envs_differ_and_episodes_record_statistics():
    """make_vec(..., "sync"): unseeded sub-envs start different episodes; RecordEpisodeStatistics sees them end."""
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs=2, vectorization_mode="sync")
    )
    try:
        obs, _ = env.reset()
        assert obs["state"][0].tobytes() != obs["state"][1].tobytes()
        ended = 0
        for _ in range(30):
            *_, info = env.step(np.zeros(env.action_space.shape, np.float32))
            ended += int(info.get("_episode", np.zeros(2, bool)).sum())
        assert ended >= 1
    finally:
        env.close()
