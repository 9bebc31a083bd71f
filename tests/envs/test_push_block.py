"""PushBlock-v0: registration, spaces, task randomisation, episode flow, rendering."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

import rollcap.envs
from rollcap.envs import BLOCKS, ENV_ID, TARGETS, VOCAB, PushBlockEnv, make_instruction, parse_instruction
from rollcap.envs.expert import ScriptedExpert


def test_registered_once_even_when_reimported():
    """Importing the package again does not re-register (no gymnasium error or warning)."""
    importlib.reload(rollcap.envs)
    env = gym.make(ENV_ID)
    assert isinstance(env, PushBlockEnv)  # bare: get_state() is on what gym.make returns
    assert env.spec.max_episode_steps is None  # the env truncates itself (exact state)


def test_spaces_exact():
    """Observation keys, shapes and dtypes are as documented."""
    env = PushBlockEnv()
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    space = env.observation_space
    assert set(space.spaces) == {"state", "image_front", "instruction"}
    assert space["state"].shape == (28,) and space["state"].dtype == np.float32
    assert space["image_front"].shape == (64, 64, 3) and space["image_front"].dtype == np.uint8
    assert isinstance(space["instruction"], gym.spaces.Text)
    obs, info = env.reset(seed=3)
    assert space.contains(obs)
    assert obs["state"].dtype == np.float32 and obs["image_front"].dtype == np.uint8
    assert set(info) == {"is_success", "action_clipped", "clip_count", "block_to_target"}


def test_options_change_spaces():
    """render_images=False drops the image key; image_size sets its side."""
    assert set(PushBlockEnv(render_images=False).observation_space.spaces) == {"state", "instruction"}
    obs, _ = PushBlockEnv(image_size=32).reset(seed=0)
    assert obs["image_front"].shape == (32, 32, 3)


def test_bad_options_are_named():
    """Unknown options suggest the nearest name; bad values name the option."""
    with pytest.raises(TypeError, match="image_size"):
        PushBlockEnv(image_sise=32)
    with pytest.raises(ValueError, match="cameras"):
        PushBlockEnv(cameras=("wrist",))
    with pytest.raises(ValueError, match="renderer"):
        PushBlockEnv(renderer="opengl")
    with pytest.raises(ValueError, match="render_mode"):
        PushBlockEnv(render_mode="human")


def test_instruction_vocabulary_round_trip():
    """Every instruction uses only VOCAB words and parses back to its task."""
    for b in range(len(BLOCKS)):
        for t in range(len(TARGETS)):
            text = make_instruction(b, t)
            assert set(text.split()) <= set(VOCAB)
            assert parse_instruction(text) == (b, t)
    with pytest.raises(ValueError, match="not a PushBlock instruction"):
        parse_instruction("stack the blocks")


def test_seed_drives_layout_and_task():
    """Same seed -> same start; different seeds -> different layouts; all 9 tasks occur."""
    env = PushBlockEnv(render_images=False)
    a, _ = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    c, _ = env.reset(seed=12)
    assert a["state"].tobytes() == b["state"].tobytes() and a["instruction"] == b["instruction"]
    assert a["state"].tobytes() != c["state"].tobytes()
    tasks = {env.reset(seed=s)[1] and env.task for s in range(60)}
    assert len(tasks) == len(BLOCKS) * len(TARGETS)


def test_instruction_matters():
    """Forcing another task keeps the layout but changes the instruction and the reward."""
    env = PushBlockEnv(render_images=False)
    o1, _ = env.reset(seed=5, options={"block": "red", "target": "left"})
    _, r1, *_ = env.step(np.zeros(2, np.float32))
    o2, _ = env.reset(seed=5, options={"block": "blue", "target": "right"})
    _, r2, *_ = env.step(np.zeros(2, np.float32))
    assert o1["state"].tobytes() == o2["state"].tobytes()
    assert o1["instruction"] == "push the red block to the left target"
    assert o2["instruction"] == "push the blue block to the right target"
    assert r1 != r2


def test_success_terminates_and_ended_episode_refuses_steps():
    """The expert reaches the target: terminated with is_success; a further step raises."""
    env = PushBlockEnv(render_images=False)
    expert = ScriptedExpert()
    obs, _ = env.reset(seed=0)
    expert.reset(0)
    for _ in range(env.config.max_steps):
        obs, reward, terminated, truncated, info = env.step(expert.act(obs))
        if terminated or truncated:
            break
    assert terminated and not truncated and info["is_success"]
    assert info["block_to_target"] <= env.config.success_radius and reward > 0
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(2, np.float32))


def test_block_velocity_adds_an_observation_and_changes_nothing_else():
    """block_velocity=True: the blocks' velocities (in the space, moving while the expert pushes) beside the same
    state, rewards and outcome as without it."""
    runs = []
    for option in (False, True):
        env = PushBlockEnv(render_images=False, block_velocity=option)
        expert = ScriptedExpert()
        obs, _ = env.reset(seed=3)
        expert.reset(3)
        steps = []
        for _ in range(env.config.max_steps):
            assert env.observation_space.contains(obs)
            obs, reward, terminated, truncated, info = env.step(expert.act(obs))
            steps.append((obs["state"].tobytes(), reward, terminated, obs.get("block_velocity")))
            if terminated or truncated:
                break
        runs.append(steps)
    assert [s[:3] for s in runs[0]] == [s[:3] for s in runs[1]] and runs[0][-1][2]
    assert all(s[3] is None for s in runs[0])
    vel = np.stack([s[3] for s in runs[1]])
    assert vel.shape[1] == 3 * len(BLOCKS) and vel.dtype == np.float32 and np.abs(vel).max() <= 1.0
    assert np.abs(vel).max() > 0.02  # a block moved


def test_truncates_at_max_steps():
    """With max_steps=3 the third idle step truncates."""
    env = PushBlockEnv(render_images=False, max_steps=3)
    env.reset(seed=0)
    flags = [env.step(np.zeros(2, np.float32))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_numpy_render_draws_blocks_where_they_are():
    """The pixel at a block's centre has the block's colour; renders are deterministic."""
    env = PushBlockEnv(image_size=64)
    obs, _ = env.reset(seed=2)
    spec = env.config.scene
    for i, rgb in enumerate(spec.block_rgb):
        x, y = obs["state"][0:2] + obs["state"][4 + 4 * i : 6 + 4 * i]
        col = int((x + spec.table_half) / (2 * spec.table_half) * 64)
        row = int((spec.table_half - y) / (2 * spec.table_half) * 64)
        assert tuple(obs["image_front"][row, col]) == tuple(round(255 * c) for c in rgb)
    again, _ = env.reset(seed=2)
    assert again["image_front"].tobytes() == obs["image_front"].tobytes()


def test_render_rgb_array():
    """render_mode='rgb_array' returns a render_size frame; render_mode=None returns None."""
    env = gym.make(ENV_ID, render_mode="rgb_array", render_size=96)
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (96, 96, 3) and frame.dtype == np.uint8
    quiet = PushBlockEnv()
    quiet.reset(seed=0)
    with pytest.warns(UserWarning, match="render_mode"):
        assert quiet.render() is None


_MUJOCO_RENDER = textwrap.dedent(
    """
    import numpy as np
    try:
        from rollcap.envs import PushBlockEnv, RenderUnavailable
    except (ImportError, OSError, AttributeError) as err:  # mujoco loads MUJOCO_GL's backend at import
        if not any(w in str(err).lower() for w in ("egl", "opengl", "osmesa", "glfw", "libgl", "mujoco_gl")):
            raise
        print("UNAVAILABLE", "import mujoco failed under MUJOCO_GL: ", type(err).__name__, err)
        raise SystemExit(0)
    try:  # a backend that cannot render here is refused when the env is made, before anything renders
        env = PushBlockEnv(renderer="mujoco")
        obs, _ = env.reset(seed=4)
    except RenderUnavailable as err:
        print("UNAVAILABLE", err)
        raise SystemExit(0)
    ref, _ = PushBlockEnv().reset(seed=4)
    same = np.all(obs["image_front"] == ref["image_front"], axis=-1).mean()
    print("AGREE", same)
    env.close()
    """
)


def _run(code: str, **env_vars: str) -> str:
    env = {**os.environ, **env_vars}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_mujoco_renderer_matches_numpy_renderer():
    """With MUJOCO_GL=egl, MuJoCo's image agrees with the numpy one on most pixels."""
    out = _run(_MUJOCO_RENDER, MUJOCO_GL="egl")
    if out.startswith("UNAVAILABLE"):
        assert "MUJOCO_GL" in out
        pytest.skip("no EGL here: " + out.strip())
    assert float(out.split()[-1]) > 0.9


def test_mujoco_renderer_without_backend_names_mujoco_gl():
    """A GL backend that cannot start raises RenderUnavailable naming MUJOCO_GL."""
    out = _run(_MUJOCO_RENDER, MUJOCO_GL="glfw", DISPLAY="")
    if out.startswith("AGREE"):
        pytest.skip("a display is available, glfw works")
    assert "MUJOCO_GL" in out and "osmesa" in out
