"""ExactStateWrapper over every gymnasium MuJoCo v5 env: long restores, the Ant/Humanoid regression, layouts."""

from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
import pytest

from rollcap.envs import ExactStateWrapper, StateMismatch
from rollcap.envs.adapters import MUJOCO_LAYOUT
from rollcap.envs.compare import canonical_bytes
from rollcap.envs.checks import check_env_exact

V5_ENVS = [
    "Ant-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Humanoid-v5",
    "HumanoidStandup-v5",
    "InvertedDoublePendulum-v5",
    "InvertedPendulum-v5",
    "Pusher-v5",
    "Reacher-v5",
    "Swimmer-v5",
    "Walker2d-v5",
]


def _wrapped(env_id: str) -> ExactStateWrapper:
    return ExactStateWrapper(gym.make(env_id))


def _actions(env: gym.Env, n: int, seed: int) -> list[np.ndarray]:
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(n)]


@pytest.mark.parametrize("env_id", V5_ENVS)
def test_check_env_exact_v5(env_id):
    """Restores right after reset, after one step and mid-episode replay 100 steps byte-exactly."""
    # The render check needs OpenGL, which is not what is tested here.
    report = check_env_exact(lambda: _wrapped(env_id), skip_render_check=True)
    assert report.restore_points == (0, 1, 37)
    assert report.steps_compared == 300


@pytest.mark.slow
@pytest.mark.parametrize("env_id", V5_ENVS)
def test_check_env_exact_v5_across_time_limit(env_id):
    """1000 steps after a restore at step 500: past the TimeLimit truncation and the unseeded reset."""
    report = check_env_exact(lambda: _wrapped(env_id), restore_at=(0, 500), steps=1000, skip_render_check=True)
    assert report.steps_compared == 2000


@pytest.mark.parametrize("env_id", ["Ant-v5", "Humanoid-v5"])
@pytest.mark.parametrize("into", ["same", "fresh"])
def test_first_step_after_mid_episode_restore(env_id, into):
    """Regression (audit issue 9.5): the first reward and info after a restore equal the uninterrupted run's."""
    env = _wrapped(env_id)
    env.reset(seed=3)
    for a in _actions(env, 12, seed=4):
        env.step(a)
    state = env.get_state()
    action = _actions(env, 1, seed=5)[0]
    _, reward, _, _, info = env.step(action)
    target = env if into == "same" else _wrapped(env_id)
    target.set_state(state)
    _, reward_again, _, _, info_again = target.step(action)
    assert canonical_bytes(reward_again) == canonical_bytes(reward)
    assert canonical_bytes(info_again) == canonical_bytes(info)


def test_state_layout_and_fingerprint():
    """MuJoCo mode holds the integration state plus xpos/xipos/xquat; the fingerprint names layout 3."""
    env = _wrapped("Ant-v5")
    env.reset(seed=0)
    env.step(_actions(env, 1, seed=1)[0])
    state = env.get_state()
    model, data = env.unwrapped.model, env.unwrapped.data
    n = mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_INTEGRATION)
    assert {k: (v.dtype.name, v.shape) for k, v in state.items()} == {
        "mj_state": ("float64", (n,)),
        "mj_xpos": ("float64", (model.nbody, 3)),
        "mj_xipos": ("float64", (model.nbody, 3)),
        "mj_xquat": ("float64", (model.nbody, 4)),
        "model_digest": ("uint8", (32,)),
        "rng": ("uint64", (7,)),
        "time_limit_steps": ("int64", (1,)),
    }
    assert state["mj_xpos"].tobytes() == data.xpos.tobytes() and not np.shares_memory(state["mj_xpos"], data.xpos)
    fp = env.state_fingerprint()
    assert fp["state_layout"] == MUJOCO_LAYOUT == 3
    assert fp["task_attributes"] == {}  # gymnasium's MuJoCo envs keep no task state outside MuJoCo
    assert sorted(fp["state_spec"]) == sorted(state)


@pytest.mark.parametrize(("layout", "lacks"), [(1, ("mj_xpos", "mj_xipos", "mj_xquat")), (2, ("mj_xquat",))])
def test_old_layout_state_refused_untouched(layout, lacks):
    """A state of an older layout (without mj_xpos/mj_xipos, or without mj_xquat) is refused by name, not half-applied."""
    env = _wrapped("Humanoid-v5")
    env.reset(seed=0)
    old = {k: v for k, v in env.get_state().items() if k not in lacks}
    env.step(_actions(env, 1, seed=1)[0])
    before = env.get_state()
    with pytest.raises(StateMismatch, match=f"old layout {layout} .*take a new snapshot"):
        env.set_state(old)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)
    foreign = dict(old, model_digest=old["model_digest"] ^ np.uint8(1))
    with pytest.raises(StateMismatch, match="another MuJoCo model"):  # the root cause still comes first
        env.set_state(foreign)


def test_restore_leaves_nothing_of_the_previous_state():
    """Derived arrays not in the state are recomputed for the restored state, not kept from before."""
    source = _wrapped("Ant-v5")
    source.reset(seed=0)
    for a in _actions(source, 8, seed=1):
        source.step(a)
    state = source.get_state()
    target = _wrapped("Ant-v5")
    target.reset(seed=7)
    target.set_state(state)
    model = target.unwrapped.model
    expected = mujoco.MjData(model)
    mujoco.mj_setState(model, expected, state["mj_state"], mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(model, expected)
    assert target.unwrapped.data.geom_xpos.tobytes() == expected.geom_xpos.tobytes()
    assert target.unwrapped.data.xpos.tobytes() == state["mj_xpos"].tobytes()


def test_a_model_mujoco_warns_about_gives_one_python_warning_and_no_log_file(tmp_path, monkeypatch):
    """gymnasium 1.4's HalfCheetah model uses settotalmass (deprecated in MuJoCo 4): built through rollcap (the env
    and its probe's copy, which compiles the model again), that is one MujocoWarning naming the env, MuJoCo's
    handler is back afterwards, and no MUJOCO_LOG.TXT is left in the working directory."""
    from rollcap.envs import errors
    from rollcap.envs.probe import clone_env
    from rollcap.rollout.build import make_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(errors, "_SAID", set())  # a process says each text once: start this test afresh
    before = mujoco.get_mju_user_warning()
    with pytest.warns(errors.MujocoWarning) as said:
        env = make_env("HalfCheetah-v5")
        clone_env(env)
    assert [str(w.message).split(" is deprecated")[0] for w in said] == [
        "HalfCheetah-v5: MuJoCo: compiler attribute 'settotalmass'"
    ]
    assert mujoco.get_mju_user_warning() is before and list(tmp_path.iterdir()) == []
