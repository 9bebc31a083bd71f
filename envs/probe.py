"""Cheap probes of an env's exactness, run on a copy so the live env is never touched.

- :func:`restore_difference`: take a state mid-episode, step, disturb the env
  (another seeded reset and steps), restore, step again: the state must read
  back as given and the observations (and rewards, flags, info) must be those
  of the original steps. :class:`~rollcap.envs.ExactStateWrapper` runs it once,
  on first use, and refuses exactness with its answer.
- :func:`repeat_difference`: ``reset(seed)`` and the same actions twice in one
  instance must give the same observations (an env that keeps state across
  resets does not).

Both return ``None`` or one line saying what differed and by how much. They
run on :func:`clone_env` copies: a few milliseconds for gymnasium's MuJoCo envs,
tens for gymnasium-robotics' (which rebuild their model when copied).
"""

from __future__ import annotations

import copy
import types
from typing import Any

import gymnasium as gym

from rollcap.envs.compare import difference
from rollcap.envs.errors import mujoco_warnings

PROBE_SEED = 20_240_501
"""Seed of the probes' resets and actions (any fixed value; unrelated to a user's seeds)."""

_STEP_PARTS = ("observation", "reward", "terminated", "truncated", "info")


def clone_env(env: gym.Env) -> gym.Env:
    """A deep copy of ``env`` and its wrappers for probing: it shares nothing mutable with ``env`` and never renders.

    Modules held as attributes are shared (they cannot be copied), a gymnasium
    MuJoCo renderer is left out (a copy may hold a GL context), and the copy's
    ``render_mode`` is None. Envs that pickle through ``EzPickle`` (gymnasium's
    MuJoCo and robotics envs) are rebuilt from their constructor arguments.

    Raises:
        Exception: whatever ``copy.deepcopy`` raises for an env that cannot be copied.
    """
    from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

    base = env.unwrapped
    memo: dict[int, Any] = {}
    for value in vars(base).values():
        if isinstance(value, types.ModuleType):
            memo[id(value)] = value
        elif isinstance(value, MujocoRenderer):
            memo[id(value)] = None
    where = getattr(env.spec, "id", None) or type(base).__name__
    with mujoco_warnings(where):  # an EzPickle env compiles its model again
        twin = copy.deepcopy(env, memo)
    if hasattr(twin.unwrapped, "render_mode"):
        twin.unwrapped.render_mode = None
    return twin


def sample_actions(space: gym.Space, n: int, seed: int) -> list[Any]:
    """``n`` actions from a seeded copy of ``space`` (the env's own space and its RNG are not used)."""
    space = copy.deepcopy(space)
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def _play(env: gym.Env, actions: list[Any]) -> list[tuple]:
    """Step ``actions``; stop after a step that ends the episode."""
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1][2] or out[-1][3]:
            break
    return out


def _steps_difference(want: list[tuple], got: list[tuple], what: str) -> str | None:
    if len(want) != len(got):
        return f"{what}: the episode ended after {len(got)} steps instead of {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        for part, x, y in zip(_STEP_PARTS, w, g):
            found = difference(part, x, y)
            if found:
                return f"{what} at step {i}: {found}"
    return None


def restore_difference(wrapper: Any, seed: int = PROBE_SEED) -> str | None:
    """Whether ``wrapper`` (an env with ``get_state``/``set_state``, a probe copy) restores exactly; None if so.

    Resets with ``seed`` and steps once (mid-episode: MuJoCo's derived arrays
    are then one substep stale, as after any step), takes the state, steps
    twice; then resets with another seed and steps twice (so state the env keeps
    outside the captured one differs), restores, reads the state back, and
    steps the same two actions again.

    Returns:
        ``None``, or one line naming the state entry that read back changed,
        or the first observation key (reward, flag, info key) that differs
        from the original steps, and by how much.
    """
    a = sample_actions(wrapper.action_space, 5, seed)
    wrapper.reset(seed=seed)
    wrapper.step(a[0])
    state = wrapper.get_state()
    want = _play(wrapper, a[1:3])
    wrapper.reset(seed=seed + 1)
    _play(wrapper, a[3:5])
    wrapper.set_state(state)
    back = wrapper.get_state()
    for key in state:
        found = difference(f"state entry {key!r}", state[key], back[key])
        if found:
            return f"restoring a state and reading it back changes it: {found}"
    return _steps_difference(want, _play(wrapper, a[1:3]), "after a restore, the steps differ from the original run's")


def repeat_difference(env: gym.Env, seed: int = PROBE_SEED, steps: int = 5) -> str | None:
    """Whether ``reset(seed)`` and ``steps`` fixed actions, done twice in ``env`` (a probe copy), repeat exactly; None if so.

    Returns:
        ``None``, or one line naming the first reset or step whose observation
        (reward, flag, info) differs between the two runs, and by how much.
    """
    actions = sample_actions(env.action_space, steps, seed)
    first = env.reset(seed=seed)
    first_steps = _play(env, actions)
    second = env.reset(seed=seed)
    for part, x, y in zip(("observation", "info"), first, second):
        found = difference(part, x, y)
        if found:
            return f"a second reset(seed={seed}) in the same env differs from the first: {found}"
    return _steps_difference(
        first_steps,
        _play(env, actions),
        f"after a second reset(seed={seed}) in the same env, the same actions give other steps",
    )
