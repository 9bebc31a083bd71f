"""One entry point that checks an env's API, seeding and exact state.

``check_env_exact(factory)`` runs gymnasium's ``check_env``, then seeded-reset
determinism, then an exact-state round trip (within one env and into a fresh
one), then that a foreign state is refused without side effects.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from rollcap.envs.adapters import find_exact_state
from rollcap.envs.errors import CheckFailed, StateMismatch


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class ExactCheckReport:
    """What :func:`check_env_exact` checked, and the warnings gymnasium's checker raised."""

    env_name: str
    """The env's spec id or class name."""
    steps_compared: int = 0
    """Steps replayed byte-for-byte after each restore."""
    warnings: list[str] = field(default_factory=list)
    """Messages of warnings raised by ``gymnasium.utils.env_checker.check_env``."""


def canonical_bytes(x: Any) -> bytes:
    """Bytes that are equal iff two observations/rewards are identical (dtype, shape, values)."""
    if isinstance(x, dict):
        return b"{" + b"".join(k.encode() + b":" + canonical_bytes(x[k]) for k in sorted(x)) + b"}"
    if isinstance(x, (tuple, list)):
        return b"[" + b",".join(canonical_bytes(v) for v in x) + b"]"
    if isinstance(x, str):
        return b"s" + x.encode()
    a = np.asarray(x)
    return f"{a.dtype}{a.shape}".encode() + a.tobytes()


def _name(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


def _actions(env: gym.Env, n: int, seed: int) -> list[Any]:
    space = env.action_space
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def _rollout(env: gym.Env, actions: list[Any]) -> list[bytes]:
    """Step ``actions`` (stopping at the end of an episode); one canonical record per step."""
    out = []
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        out.append(canonical_bytes((obs, float(reward), bool(terminated), bool(truncated))))
        if terminated or truncated:
            break
    return out


def _same(a: list[bytes], b: list[bytes], what: str) -> None:
    if len(a) != len(b):
        raise CheckFailed(f"{what}: {len(a)} steps vs {len(b)} steps (episode ended differently)")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            raise CheckFailed(f"{what}: first divergence at step {i} after the restore")


def _same_state(a: dict, b: dict, what: str) -> None:
    if canonical_bytes(a) != canonical_bytes(b):
        diff = sorted(k for k in a if k not in b or canonical_bytes(a[k]) != canonical_bytes(b[k]))
        raise CheckFailed(f"{what}: state entries differ: {diff}")


def check_env_exact(
    env_factory: Callable[[], gym.Env],
    *,
    seed: int = 0,
    steps_before: int = 5,
    steps: int = 20,
    skip_render_check: bool = False,
) -> ExactCheckReport:
    """Check an env built by ``env_factory`` (called up to three times).

    Checks: gymnasium's ``check_env`` on the unwrapped env; ``reset(seed)``
    twice, and in a second instance, gives identical observations; after
    ``steps_before`` random steps, ``get_state`` -> ``steps`` random steps ->
    ``set_state`` -> the same actions reproduce observations, rewards and
    done flags byte-for-byte, in the same env and in a fresh one; the state
    layer implements ``Stateful`` with a JSON-able fingerprint; a state with a
    foreign model digest raises ``StateMismatch`` and changes nothing.

    Returns:
        A report (including gymnasium's warnings, which are not failures).

    Raises:
        CheckFailed: the first failed check, naming it.
        NoExactState: the env does not declare exact state.
    """
    env = env_factory()
    report = ExactCheckReport(env_name=_name(env))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=skip_render_check)
    report.warnings = [_ANSI.sub("", str(w.message)) for w in caught]
    env.close()

    env, other = env_factory(), env_factory()
    try:
        first = canonical_bytes(env.reset(seed=seed)[0])
        if canonical_bytes(env.reset(seed=seed)[0]) != first:
            raise CheckFailed("reset(seed) twice in one env gave different observations")
        if canonical_bytes(other.reset(seed=seed)[0]) != first:
            raise CheckFailed("reset(seed) in two env instances gave different observations")

        # Imported here: rollcap.capsule imports torch, and `import rollcap.envs` stays light.
        from rollcap.capsule.protocol import Stateful

        handle = find_exact_state(env)
        if not isinstance(handle, Stateful):
            raise CheckFailed(f"{type(handle).__name__} does not implement the Stateful protocol")
        json.dumps(handle.state_fingerprint())

        before = _actions(env, steps_before, seed + 1)
        if len(_rollout(env, before)) < len(before):
            env.reset(seed=seed + 2)
        state = handle.get_state()
        actions = _actions(env, steps, seed + 3)
        reference = _rollout(env, actions)

        handle.set_state(state)
        _same_state(state, handle.get_state(), "get_state() right after set_state()")
        _same(reference, _rollout(env, actions), "replay in the same env")

        other_handle = find_exact_state(other)
        other.reset(seed=seed + 4)
        other_handle.set_state(state)
        _same(reference, _rollout(other, actions), "replay in a fresh env")
        report.steps_compared = len(reference)

        _check_refuses_foreign(handle, state)
    finally:
        env.close()
        other.close()
    return report


def _check_refuses_foreign(handle: Any, state: dict[str, np.ndarray]) -> None:
    """A state whose model digest differs must raise StateMismatch and leave the env as it was."""
    now = handle.get_state()
    foreign = {k: np.array(v, copy=True) for k, v in state.items()}
    foreign["model_digest"] = foreign["model_digest"] ^ np.uint8(0xFF)
    try:
        handle.set_state(foreign)
    except StateMismatch:
        pass
    else:
        raise CheckFailed("set_state() accepted a state with a foreign model digest")
    _same_state(now, handle.get_state(), "state after a refused set_state()")
