"""Bad actions and foreign states: clear errors, simulator untouched."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rollcap.envs import ENV_ID, BadAction, PushBlockEnv, StateMismatch
from rollcap.envs.adapters import ExactStateWrapper
from rollcap.envs.compare import canonical_bytes


def _env() -> PushBlockEnv:
    env = PushBlockEnv(render_images=False)
    env.reset(seed=0)
    env.step(np.array([0.5, 0.5], np.float32))
    return env


@pytest.mark.parametrize("bad", [[np.nan, 0.0], [0.0, np.inf], [-np.inf, np.nan]])
def test_non_finite_action_refused_before_the_simulator(bad):
    """NaN/Inf raises BadAction (a ValueError) and changes no state."""
    env = _env()
    before = env.get_state()
    with pytest.raises(ValueError, match="non-finite") as err:
        env.step(np.array(bad, np.float32))
    assert isinstance(err.value, BadAction)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)


@pytest.mark.parametrize("bad", [[1.0], [0.0, 0.0, 0.0], "left", [[0.0, 0.0]]])
def test_wrong_shape_action_refused(bad):
    """Actions that are not 2 numbers raise BadAction naming the shape."""
    env = _env()
    before = env.get_state()
    with pytest.raises(BadAction, match="action must"):
        env.step(bad)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)


def test_out_of_range_action_is_clipped_and_counted():
    """[5, -3] acts exactly like [1, -1]; info reports the clip and counts components."""
    a, b = _env(), _env()
    obs_a, r_a, *_, info_a = a.step(np.array([5.0, -3.0], np.float32))
    obs_b, r_b, *_, info_b = b.step(np.array([1.0, -1.0], np.float32))
    assert canonical_bytes((obs_a, r_a)) == canonical_bytes((obs_b, r_b))
    assert info_a["action_clipped"] and info_a["clip_count"] == 2
    assert not info_b["action_clipped"] and info_b["clip_count"] == 0
    _, _, _, _, info = a.step(np.array([0.0, 1.5], np.float32))
    assert info["clip_count"] == 3


def test_step_before_reset_raises():
    """Stepping a never-reset env raises and names reset()."""
    with pytest.raises(RuntimeError, match="reset"):
        PushBlockEnv(render_images=False).step(np.zeros(2, np.float32))


def test_reacher_state_into_pushblock_refused():
    """A Reacher-v5 state restored into PushBlock names the model mismatch; nothing changes."""
    reacher = ExactStateWrapper(gym.make("Reacher-v5"))
    reacher.reset(seed=0)
    foreign = reacher.get_state()
    env = _env()
    before = env.get_state()
    reference = _env()
    with pytest.raises(StateMismatch, match="another MuJoCo model"):
        env.set_state(foreign)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)
    action = np.array([0.1, -0.4], np.float32)
    assert canonical_bytes(env.step(action)[:4]) == canonical_bytes(reference.step(action)[:4])


def test_pushblock_state_into_reacher_refused():
    """The adapter refuses a PushBlock state too, leaving Reacher untouched."""
    reacher = ExactStateWrapper(gym.make("Reacher-v5"))
    reacher.reset(seed=0)
    before = reacher.get_state()
    with pytest.raises(StateMismatch, match="another MuJoCo model"):
        reacher.set_state(_env().get_state())
    assert canonical_bytes(reacher.get_state()) == canonical_bytes(before)


def test_state_without_digest_refused_by_size():
    """Without a digest entry, a wrong-size mj_state is still named."""
    env = _env()
    state = env.get_state()
    del state["model_digest"]
    with pytest.raises(StateMismatch, match="missing \\['model_digest'\\]"):
        env.set_state(state)
    with pytest.raises(StateMismatch, match="mapping"):
        env.set_state([1, 2, 3])
    assert gym.make(ENV_ID) is not None


def test_adapter_refuses_non_finite_action():
    """ExactStateWrapper stops NaN before a gymnasium MuJoCo env integrates it."""
    env = ExactStateWrapper(gym.make("Pusher-v5"))
    env.reset(seed=0)
    before = env.get_state()
    action = np.zeros(env.action_space.shape, np.float32)
    action[3] = np.nan
    with pytest.raises(BadAction, match="non-finite"):
        env.step(action)
    assert canonical_bytes(env.get_state()) == canonical_bytes(before)


@pytest.mark.parametrize(
    "kw",
    [{"max_steps": True}, {"frame_skip": True}, {"render_size": True}, {"max_speed": True}, {"success_radius": "x"}],
)
def test_a_json_true_or_a_string_is_not_a_number(kw):
    """`--env-kwargs '{"max_steps": true}'` is refused naming the option (True was taken as 1 step); so are the others."""
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"^{name} must be "):
        gym.make("rollcap/PushBlock-v0", **kw)
