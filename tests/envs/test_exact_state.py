"""Exact state: the check suite, state layout, capsules, the adapter and its declarations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rollcap.capsule import Stateful, restore, snapshot
from rollcap.envs import ENV_ID, NoExactState, PushBlockEnv, StateMismatch
from rollcap.envs.adapters import ExactStateWrapper, WithoutExactState, declares_exact_state, find_exact_state
from rollcap.envs.compare import canonical_bytes
from rollcap.envs.checks import check_env_exact

# gymnasium's MuJoCo v5 envs are checked in test_mujoco_v5.py.
FACTORIES = {
    "pushblock-images": lambda: gym.make(ENV_ID),
    "pushblock-state-only": lambda: gym.make(ENV_ID, render_images=False),
    "pushblock-time-limit": lambda: ExactStateWrapper(gym.make(ENV_ID, render_images=False, max_episode_steps=30)),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_check_env_exact(name):
    """gymnasium's checker, seeded resets and byte-exact restores at three points all pass."""
    report = check_env_exact(FACTORIES[name], restore_at=(0, 1, 40), steps=120)
    assert report.restore_points == (0, 1, 40) and report.steps_compared == 360
    assert report.warnings == []


@pytest.mark.parametrize(("kwargs", "match"), [({"restore_at": ()}, "restore_at"), ({"steps": 0}, "steps")])
def test_check_env_exact_validates_arguments(kwargs, match):
    """Empty restore points or a zero horizon are refused before any env is built."""
    with pytest.raises(ValueError, match=match):
        check_env_exact(lambda: pytest.fail("factory called"), **kwargs)


def test_canonical_bytes_of_info_values():
    """None and object values compare by value, not by pointer; dtype and shape count."""
    assert canonical_bytes({"a": None, "b": [1.0]}) == canonical_bytes({"b": [1.0], "a": None})
    assert canonical_bytes(np.array([object()], dtype=object)) != canonical_bytes(np.array([object()], dtype=object))
    assert canonical_bytes(np.float32(1)) != canonical_bytes(np.float64(1))
    assert canonical_bytes(np.zeros((2, 1))) != canonical_bytes(np.zeros((1, 2)))


def _play(env, actions):
    return [canonical_bytes(env.step(a)[:4]) for a in actions]


def test_state_layout():
    """get_state returns the documented entries, dtypes and shapes, as fresh copies."""
    env = PushBlockEnv(render_images=False)
    env.reset(seed=0)
    state = env.get_state()
    layout = {k: (v.dtype.name, v.shape) for k, v in state.items()}
    assert layout == {
        "mj_state": ("float64", (77,)),
        "model_digest": ("uint8", (32,)),
        "rng": ("uint64", (7,)),
        "step": ("int64", (1,)),
        "clip_count": ("int64", (1,)),
        "phase": ("int64", (1,)),
        "task": ("int64", (2,)),
        "instruction": ("uint8", (64,)),
    }
    assert bytes(state["instruction"]).rstrip(b"\0").decode() == env.instruction
    env.step(np.ones(2, np.float32))
    assert state["step"][0] == 0 and state["mj_state"].tobytes() != env.get_state()["mj_state"].tobytes()


def test_rng_state_restored_so_next_reset_matches():
    """The env RNG is part of the state: an unseeded reset after a restore repeats."""
    env = PushBlockEnv(render_images=False)
    env.reset(seed=9)
    state = env.get_state()
    first = canonical_bytes(env.reset()[0])
    env.set_state(state)
    assert canonical_bytes(env.reset()[0]) == first


def test_capsule_round_trip_into_fresh_env():
    """A rollcap.capsule snapshot restores into a new, never-reset env byte-exactly."""
    env = PushBlockEnv()
    env.reset(seed=1)
    env.step(np.array([0.2, 0.9], np.float32))
    assert isinstance(env, Stateful)
    capsule = snapshot({"env": env}, "mid-episode", tier="host")
    actions = [np.array([np.sin(i), np.cos(i)], np.float32) for i in range(15)]
    reference = _play(env, actions)
    fresh = PushBlockEnv()
    restore(capsule, {"env": fresh})
    assert _play(fresh, actions) == reference


def test_set_state_accepts_torch_tensors():
    """Capsules may hand back torch tensors; they restore the same."""
    env = PushBlockEnv(render_images=False)
    env.reset(seed=3)
    state = env.get_state()
    reference = _play(env, [np.ones(2, np.float32)] * 5)
    env.set_state({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    assert _play(env, [np.ones(2, np.float32)] * 5) == reference


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: s.update(mj_state=s["mj_state"][:-1]), "mj_state"),
        (lambda s: s.pop("task"), "missing \\['task'\\]"),
        (lambda s: s.update(step=s["step"].astype(np.int32)), "'step' is int32"),
        (lambda s: s.update(task=np.array([1, 2], np.int64)), "does not match task"),
        (lambda s: s.update(task=np.array([7, 0], np.int64)), "out of range"),
    ],
)
def test_bad_state_is_refused_untouched(mutate, match):
    """A damaged state names what is wrong and leaves the env as it was."""
    env = PushBlockEnv(render_images=False)
    env.reset(seed=4)
    env.step(np.ones(2, np.float32))
    before = env.get_state()
    bad = {k: v.copy() for k, v in before.items()}
    mutate(bad)
    with pytest.raises(StateMismatch, match=match):
        env.set_state(bad)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)


def test_declarations():
    """Raw TimeLimit chains and non-MuJoCo envs do not declare exact state; wrapped MuJoCo envs do."""
    assert declares_exact_state(gym.make(ENV_ID))
    assert not declares_exact_state(gym.make("Pusher-v5"))  # TimeLimit holds state
    assert declares_exact_state(ExactStateWrapper(gym.make("Pusher-v5")))
    cart = ExactStateWrapper(gym.make("CartPole-v1"))
    assert not declares_exact_state(cart)
    with pytest.raises(NoExactState, match="CartPoleEnv has neither a MuJoCo model"):
        cart.get_state()
    with pytest.raises(NoExactState, match="ExactStateWrapper"):
        find_exact_state(gym.make("Pusher-v5"))


def test_unknown_wrapper_needs_vouching():
    """A wrapper that may hold state blocks exact state until declared stateless."""
    inner = gym.wrappers.TransformReward(gym.make("Reacher-v5"), lambda r: 2 * r)
    wrapped = ExactStateWrapper(inner)
    assert not wrapped.exact_state and "TransformReward" in wrapped.exact_state_reason
    assert ExactStateWrapper(inner, extra_stateless=(gym.wrappers.TransformReward,)).exact_state


def test_without_exact_state_mixin():
    """An env declaring exact_state = False raises a clear NoExactState."""

    class Robot(WithoutExactState, gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,))
        action_space = gym.spaces.Box(-1, 1, (1,))

    robot = Robot()
    assert not declares_exact_state(robot)
    with pytest.raises(NoExactState, match="Robot declares exact_state = False"):
        robot.get_state()


def test_adapter_restores_time_limit_and_order_enforcing():
    """TimeLimit's counter is in the state: truncation happens at the same step after restore."""
    env = ExactStateWrapper(gym.make(ENV_ID, render_images=False, max_episode_steps=8))
    env.reset(seed=0)
    idle = np.zeros(2, np.float32)
    for _ in range(5):
        env.step(idle)
    state = env.get_state()
    assert state["time_limit_steps"].tolist() == [5]
    fresh = ExactStateWrapper(gym.make(ENV_ID, render_images=False, max_episode_steps=8))
    fresh.set_state(state)  # no reset: the restore counts as one for OrderEnforcing
    assert [fresh.step(idle)[3] for _ in range(3)] == [False, False, True]
    fp = fresh.state_fingerprint()
    assert fp["env_id"] == ENV_ID and fp["time_limits"] == [8]


def test_restore_into_never_reset_gymnasium_env():
    """A fresh gym.make chain (OrderEnforcing, PassiveEnvChecker) steps right after a restore."""
    source = ExactStateWrapper(gym.make("Reacher-v5"))
    source.reset(seed=2)
    state = source.get_state()
    actions = [np.full(2, 0.3 * (-1) ** i, np.float32) for i in range(6)]
    reference = _play(source, actions)
    fresh = ExactStateWrapper(gym.make("Reacher-v5"))
    fresh.set_state(state)
    assert _play(fresh, actions) == reference


def test_restore_into_never_reset_pushblock_from_make():
    """gym.make(PushBlock) is the bare env: restore and step with no reset, no wrapper."""
    source = gym.make(ENV_ID)
    source.reset(seed=8)
    state = source.get_state()
    actions = [np.array([0.5, 1.0], np.float32)] * 6
    reference = _play(source, actions)
    fresh = gym.make(ENV_ID)
    fresh.set_state(state)
    assert _play(fresh, actions) == reference
