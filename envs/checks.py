"""Checks of an env's API, seeding and exact state: a thorough one and a cheap one.

``check_env_exact(factory)`` runs gymnasium's ``check_env``, then seeded-reset
determinism, then exact-state restores at several steps of one long reference
run (right after the reset, after one step, mid-episode), each replayed for
``steps`` (default 100) steps within the same env and in another one and
compared byte-for-byte (observations, rewards, done flags, info, resets),
then that a foreign state is refused without side effects. It is for tests
and for vetting a new env.

``probe_exactness(env)`` answers, in milliseconds and without touching the
live env, whether an env is repeatable (a seeded reset and the same actions
give the same observations twice) and exact (it has an exact-state layer whose
restore check passed), and if not, why: what a recorder asks before it records.
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
from rollcap.envs.compare import canonical_bytes
from rollcap.envs.errors import CheckFailed, NoExactState, StateMismatch
from rollcap.envs.probe import PROBE_SEED, clone_env, repeat_difference, sample_actions


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class ExactCheckReport:
    """What :func:`check_env_exact` checked, and the warnings gymnasium's checker raised."""

    env_name: str
    """The env's spec id or class name."""
    restore_points: tuple[int, ...] = ()
    """Steps of the reference run that were restored (0 = right after the reset)."""
    steps_compared: int = 0
    """Steps replayed byte-for-byte, summed over the restore points (per env)."""
    warnings: list[str] = field(default_factory=list)
    """Messages of warnings raised by ``gymnasium.utils.env_checker.check_env``."""


@dataclass(frozen=True)
class EnvExactness:
    """What :func:`probe_exactness` found about one env."""

    env_name: str
    """The env's spec id or class name."""
    repeatable: bool | None
    """A seeded reset and the same actions gave the same steps twice in one instance
    (``None``: not checked, the env could not be copied; ``reason`` says why)."""
    exact: bool
    """The env has an exact-state layer (``exact_state_of``) and its restore check passed."""
    reason: str = ""
    """Why it is not repeatable or not exact (``"; "``-joined), in plain words; ``""`` when both hold."""

    @property
    def ok(self) -> bool:
        """Repeatable and exact: its recordings replay byte-for-byte."""
        return bool(self.repeatable) and self.exact


def probe_exactness(env: gym.Env, *, seed: int = PROBE_SEED, steps: int = 5) -> EnvExactness:
    """Whether ``env`` is repeatable and exact, and if not why; the live env is left exactly as it was.

    Repeatable: on a copy of ``env`` (:func:`rollcap.envs.probe.clone_env`),
    ``reset(seed)`` and ``steps`` fixed actions, twice in a row, give identical
    observations, rewards, flags and info (an env that keeps state across
    resets, like MetaWorld's reach, does not). Exact: ``exact_state_of(env)``
    finds a layer; an :class:`~rollcap.envs.ExactStateWrapper` has by then run
    its restore check (once per instance). Cheap: one copy and ``2 * steps``
    steps, plus the wrapper's check on its first use.

    Args:
        env: the env as the caller holds it (wrappers included).
        seed: seed of the resets and of the actions.
        steps: steps per run, >= 1.

    Raises:
        ValueError: ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    reasons = []
    try:
        twin = clone_env(env)
    except Exception as err:  # noqa: BLE001 - any env may fail to copy; the reason says how
        repeatable = None
        reasons.append(f"repeatability not checked: the env could not be copied ({type(err).__name__}: {err})")
    else:
        try:
            with warnings.catch_warnings():  # gymnasium's checkers warn about the copy, not the live env
                warnings.simplefilter("ignore")
                why = repeat_difference(twin, seed, steps)
        finally:
            twin.close()
        repeatable = why is None
        if why:
            reasons.append(f"not repeatable: {why}")
    try:
        find_exact_state(env)
        exact = True
    except NoExactState as err:
        exact = False
        reasons.append(f"not exact: {err}")
    return EnvExactness(_name(env), repeatable, exact, "; ".join(reasons))


def _name(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


Record = dict[str, bytes]
"""One step of a trajectory: canonical bytes of each part (``obs``, ``reward``,
``terminated``, ``truncated``, ``info.<key>``, and ``reset.obs`` / ``reset.info.<key>``
when the step ended the episode and the check reset the env)."""


def _parts(prefix: str, obs: Any, info: dict[str, Any]) -> Record:
    rec = {prefix + "obs": canonical_bytes(obs)}
    rec.update({f"{prefix}info.{k}": canonical_bytes(v) for k, v in info.items()})
    return rec


def _rollout(
    env: gym.Env, actions: list[Any], handle: Any = None, keep: tuple[int, ...] = ()
) -> tuple[list[Record], dict[int, dict]]:
    """Step ``actions``, resetting (unseeded: the RNG is in the state) where an episode ends.

    Returns:
        One record per action, and ``handle.get_state()`` taken before the
        actions whose index is in ``keep``.
    """
    out, states = [], {}
    for i, a in enumerate(actions):
        if i in keep:
            states[i] = handle.get_state()
        obs, reward, terminated, truncated, info = env.step(a)
        rec = _parts("", obs, info)
        rec.update(
            reward=canonical_bytes(float(reward)),
            terminated=canonical_bytes(bool(terminated)),
            truncated=canonical_bytes(bool(truncated)),
        )
        if terminated or truncated:
            rec.update(_parts("reset.", *env.reset()))
        out.append(rec)
    return out, states


def _same(a: list[Record], b: list[Record], what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            diff = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            raise CheckFailed(f"{what}: first divergence at step {i} after the restore, in {diff}")


def _same_state(a: dict, b: dict, what: str) -> None:
    if canonical_bytes(a) != canonical_bytes(b):
        diff = sorted(k for k in a if k not in b or canonical_bytes(a[k]) != canonical_bytes(b[k]))
        raise CheckFailed(f"{what}: state entries differ: {diff}")


def check_env_exact(
    env_factory: Callable[[], gym.Env],
    *,
    seed: int = 0,
    restore_at: tuple[int, ...] = (0, 1, 37),
    steps: int = 100,
    skip_render_check: bool = False,
) -> ExactCheckReport:
    """Check an env built by ``env_factory`` (called three times).

    Checks: gymnasium's ``check_env`` on the unwrapped env; ``reset(seed)``
    twice, and in a second instance, gives identical observations; the state
    layer implements ``Stateful`` with a JSON-able fingerprint. Then one
    reference run of ``max(restore_at) + steps`` random actions from
    ``reset(seed)``, with ``get_state`` before the actions at ``restore_at``
    (0 = right after the reset; episodes that end are reset unseeded and go
    on). From each of those states, ``set_state`` and the next ``steps``
    actions must reproduce observations, rewards, done flags, info and the
    resets byte-for-byte, in the same env and in a second one that held
    another state. Last, a state with a foreign model digest raises
    ``StateMismatch`` and changes nothing.

    Args:
        env_factory: builds the env (its exact-state layer found by ``find_exact_state``).
        seed: seeds the resets and the random actions.
        restore_at: steps of the reference run to restore at, each >= 0.
        steps: steps compared after each restore, >= 1.
        skip_render_check: passed to gymnasium's ``check_env``.

    Returns:
        A report (including gymnasium's warnings, which are not failures).

    Raises:
        CheckFailed: the first failed check, naming it (and the parts that differ).
        NoExactState: the env does not declare exact state (or its adapter's
            first-use restore check failed; the message says why).
        ValueError: ``restore_at`` or ``steps`` out of range.
    """
    if not restore_at or any(not isinstance(p, int) or p < 0 for p in restore_at):
        raise ValueError(f"restore_at must be non-empty step indices >= 0, got {restore_at!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    env = env_factory()
    report = ExactCheckReport(env_name=_name(env), restore_points=tuple(sorted(set(restore_at))))
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

        actions = sample_actions(env.action_space, max(restore_at) + steps, seed + 1)
        env.reset(seed=seed)
        reference, states = _rollout(env, actions, handle, report.restore_points)
        other_handle = find_exact_state(other)
        other.reset(seed=seed + 2)
        _rollout(other, sample_actions(other.action_space, 3, seed + 3))  # a state unlike any restored one
        for p in report.restore_points:
            handle.set_state(states[p])
            _same_state(states[p], handle.get_state(), f"get_state() right after set_state() of step {p}")
            want, replay = reference[p : p + steps], actions[p : p + steps]
            _same(want, _rollout(env, replay)[0], f"restored at step {p} in the same env")
            other_handle.set_state(states[p])
            _same(want, _rollout(other, replay)[0], f"restored at step {p} in another env")
            report.steps_compared += steps

        _check_refuses_foreign(handle, states[report.restore_points[-1]])
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
