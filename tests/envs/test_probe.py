"""The adapter's first-use restore check, task attributes, and probe_exactness (repeatable / exact, and why not)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.mujoco.reacher_v5 import ReacherEnv

from rollcap.envs import ENV_ID, ExactStateWrapper, NoExactState, exact_state_of, probe_exactness
from rollcap.envs.compare import canonical_bytes, difference
from rollcap.envs.checks import check_env_exact


class CountingReacher(ReacherEnv):
    """Reacher that keeps task state in Python attributes: a per-episode offset added to the
    observation (an array) and a step counter added to the reward (an int)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.count = 0
        self.offset = np.zeros(2)
        self.history: list[float] = []

    def reset_model(self):
        self.count = 0
        self.offset = self.np_random.uniform(-1.0, 1.0, 2)
        return super().reset_model() + np.pad(self.offset, (0, 8))

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.count += 1
        return obs + np.pad(self.offset, (0, 8)), reward + 0.01 * self.count, terminated, truncated, info


class DeclaringReacher(CountingReacher):
    """The same env naming its task attributes itself."""

    rollcap_task_attributes = ("count", "offset")


class DriftingReacher(ReacherEnv):
    """Reacher whose every reset starts a little further along: state kept across resets, so a
    seeded reset does not repeat (as MetaWorld's reach does)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.resets = 0

    def reset_model(self):
        super().reset_model()
        self.resets += 1
        self.set_state(self.data.qpos + 0.01 * self.resets, self.data.qvel)
        return self._get_obs()


class UncopyableReacher(ReacherEnv):
    """Reacher that refuses to be copied (as an env holding a connection to a robot would)."""

    def __deepcopy__(self, memo):
        raise TypeError("holds a connection that cannot be copied")


def _steps(env, actions):
    return [canonical_bytes(env.step(a)) for a in actions]


def _actions(env, n, seed):
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(n)]


def test_uncaptured_task_state_refused_with_the_key_and_size():
    """An env whose observations differ after a restore is not exact; the reason names the key and the size."""
    env = ExactStateWrapper(CountingReacher())
    assert not env.exact_state
    assert "does not restore exactly" in env.exact_state_reason
    assert "observation differs by up to" in env.exact_state_reason and "task_attributes=" in env.exact_state_reason
    assert exact_state_of(env) is None
    with pytest.raises(NoExactState, match="observation differs by up to"):
        env.get_state()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ExactStateWrapper(CountingReacher(), task_attributes=("count", "offset")),
        lambda: ExactStateWrapper(DeclaringReacher()),
    ],
    ids=["argument", "class-attribute"],
)
def test_task_attributes_captured_by_value(make):
    """Named task attributes go into the state and come back as the kind they were (int stays int)."""
    env = make()
    assert env.exact_state, env.exact_state_reason
    env.reset(seed=1)
    for a in _actions(env, 3, seed=2):
        env.step(a)
    state = env.get_state()
    assert state["task.count"].dtype == np.int64 and state["task.count"].shape == () and int(state["task.count"]) == 3
    assert state["task.offset"].tolist() == env.unwrapped.offset.tolist() and not np.shares_memory(
        state["task.offset"], env.unwrapped.offset
    )
    actions = _actions(env, 6, seed=3)
    reference = _steps(env, actions)
    env.reset(seed=9)
    env.set_state(state)
    assert type(env.unwrapped.count) is int and isinstance(env.unwrapped.offset, np.ndarray)
    assert _steps(env, actions) == reference
    assert env.state_fingerprint()["task_attributes"] == {"count": "int", "offset": "ndarray"}


def test_check_env_exact_with_task_attributes():
    """The full check agrees with the first-use check once the attributes are named."""
    report = check_env_exact(
        lambda: ExactStateWrapper(gym.wrappers.TimeLimit(DeclaringReacher(), 50)), restore_at=(0, 7), steps=60
    )
    assert report.steps_compared == 120


def test_attribute_that_cannot_be_captured_is_named():
    """A list attribute cannot be captured by value: exactness is refused with its name and type."""
    env = ExactStateWrapper(CountingReacher(), task_attributes=("count", "offset", "history"))
    assert not env.exact_state
    assert env.exact_state_reason.startswith(
        "task attribute CountingReacher.history is a list, which cannot be captured by value"
    )
    missing = ExactStateWrapper(CountingReacher(), task_attributes=("nope",))
    assert not missing.exact_state and "CountingReacher.nope does not exist" in missing.exact_state_reason


def test_task_attributes_argument_is_validated():
    """A bare string or a non-identifier is refused in one line."""
    with pytest.raises(TypeError, match="tuple of names"):
        ExactStateWrapper(CountingReacher(), task_attributes="count")
    with pytest.raises(TypeError, match="attribute names"):
        ExactStateWrapper(CountingReacher(), task_attributes=("not a name",))


def test_first_use_check_leaves_live_env_untouched():
    """Reading exact_state mid-episode changes nothing of the live env: mjData, attributes, RNG, counters."""
    env = ExactStateWrapper(gym.wrappers.TimeLimit(DeclaringReacher(), 50))
    env.reset(seed=3)
    for a in _actions(env, 5, seed=4):
        env.step(a)
    base = env.unwrapped

    def everything():
        data = {n: getattr(base.data, n) for n in dir(base.data) if isinstance(getattr(base.data, n, None), np.ndarray)}
        return canonical_bytes(
            [data, base.count, base.offset, repr(base.np_random.bit_generator.state), env.env._elapsed_steps]
        )

    before = everything()
    assert env.exact_state
    assert everything() == before


def test_uncopyable_env_needs_vouching():
    """An env that cannot be copied is not checked, so not called exact, unless verify=False vouches for it."""
    env = ExactStateWrapper(UncopyableReacher())
    assert not env.exact_state
    assert "could not be copied to check its restores (TypeError: holds a connection" in env.exact_state_reason
    vouched = ExactStateWrapper(UncopyableReacher(), verify=False)
    assert vouched.exact_state
    vouched.reset(seed=0)
    state = vouched.get_state()
    actions = _actions(vouched, 4, seed=1)
    reference = _steps(vouched, actions)
    vouched.set_state(state)
    assert _steps(vouched, actions) == reference
    report = probe_exactness(vouched)
    assert report.repeatable is None and report.exact and "repeatability not checked" in report.reason


def test_probe_exactness_finds_a_non_repeatable_env():
    """An env keeping state across resets is reported not repeatable, with the differing part and size."""
    env = ExactStateWrapper(gym.wrappers.TimeLimit(DriftingReacher(), 50))
    env.reset(seed=0)
    before = canonical_bytes(env.get_state())
    report = probe_exactness(env)
    assert report.repeatable is False and report.exact and not report.ok
    assert "not repeatable: a second reset(seed=" in report.reason and "observation differs by up to" in report.reason
    assert canonical_bytes(env.get_state()) == before  # probed on a copy


@pytest.mark.parametrize(
    ("make", "exact"),
    [
        (lambda: gym.make(ENV_ID, render_images=False), True),
        (lambda: ExactStateWrapper(gym.make("Hopper-v5")), True),
        (lambda: gym.make("Hopper-v5"), False),
        (lambda: gym.make("CartPole-v1"), False),
    ],
    ids=["pushblock", "hopper-wrapped", "hopper-bare", "cartpole"],
)
def test_probe_exactness_known_envs(make, exact):
    """Built-in and gymnasium envs are repeatable; exact exactly when they have an exact-state layer."""
    report = probe_exactness(make())
    assert report.repeatable is True and report.exact is exact
    assert (report.reason == "") is exact
    if not exact:
        assert report.reason.startswith("not exact: ")


def test_probe_exactness_validates_steps():
    """A probe of zero steps is refused."""
    with pytest.raises(ValueError, match="steps must be >= 1"):
        probe_exactness(gym.make("CartPole-v1"), steps=0)


def test_difference_names_part_and_size():
    """difference() names the first differing key of nested observations and by how much."""
    a = {"achieved_goal": np.zeros(3), "desired_goal": np.array([1.0, 2.0, 3.0])}
    b = {"achieved_goal": np.zeros(3), "desired_goal": np.array([1.0, 2.5, 3.0])}
    assert difference("observation", a, b) == "observation['desired_goal'] differs by up to 0.5 in 1 of 3 values"
    assert difference("observation", a, dict(a)) is None
    assert difference("x", np.zeros(2), np.zeros(3)) == "x is float64[3], was float64[2]"
    assert difference("info", {"k": "a"}, {"k": "b"}) == "info['k'] differs: 'a' vs 'b'"
