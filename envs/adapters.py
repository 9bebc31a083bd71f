"""Give gymnasium / MuJoCo envs the exact ``get_state`` / ``set_state`` of rollcap envs.

:class:`ExactStateWrapper` captures a MuJoCo env's full integration state
(``mjSTATE_INTEGRATION`` through ``env.unwrapped.model`` / ``data``), the
derived body frames envs read before they step (``xpos``, ``xipos``,
``xquat``), the task state the env keeps in Python attributes (a goal; see
:mod:`rollcap.envs.task_state`), its ``np_random`` and the elapsed steps of
every ``TimeLimit`` in the wrapper chain; over an env that declares exact state
itself (``rollcap/PushBlock-v0``) it delegates to that env and adds the
``TimeLimit`` counters. On first use it checks, on a copy of the env, that a
restore reproduces the original steps (:func:`rollcap.envs.probe.restore_difference`).
Envs it cannot capture (no MuJoCo, a wrapper that may hold state, or
observations that differ after a restore) get ``exact_state = False`` and a
``get_state`` that raises :class:`NoExactState` saying why.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import wrappers as gw

from rollcap.envs.errors import BadAction, NoExactState, StateMismatch
from rollcap.envs.probe import PROBE_SEED, clone_env, restore_difference
from rollcap.envs.state import (
    MJ_DERIVED,
    get_mj_derived,
    get_mj_state,
    model_digest_of,
    rng_state_from_array,
    rng_to_array,
    set_mj_state,
    spec_of,
    spec_to_json,
    validate_state,
)
from rollcap.envs.task_state import TASK_PREFIX, get_task_state, set_task_state, task_attributes_of

STATELESS_WRAPPERS: tuple[type, ...] = (
    gw.OrderEnforcing,
    gw.PassiveEnvChecker,
    gw.ClipAction,
    gw.RescaleAction,
    gw.DtypeObservation,
    gw.FlattenObservation,
    gw.ReshapeObservation,
    gw.RescaleObservation,
)
"""Gymnasium wrappers known to hold no state that changes observations or rewards."""

MUJOCO_LAYOUT = 3
"""Version of :class:`ExactStateWrapper`'s MuJoCo-mode state layout, in its fingerprint.

1: ``mj_state``, ``model_digest``, ``rng`` (``time_limit_steps``); 2: adds
``mj_xpos`` and ``mj_xipos``; 3: adds ``mj_xquat`` and the task attributes
(``task.<name>``). A state of an older layout is refused with a
:class:`StateMismatch` that says so."""

_OLD_LAYOUTS = {1: frozenset({"mj_xpos", "mj_xipos", "mj_xquat"}), 2: frozenset({"mj_xquat"})}
"""Old layout -> the derived entries it lacks (it has no task entries either)."""


class WithoutExactState:
    """Mixin for envs that cannot restore their state (a real robot, an opaque simulator).

    ``declares_exact_state(env)`` is False for them and ``get_state`` raises.
    """

    exact_state = False

    def get_state(self) -> dict[str, np.ndarray]:
        """Raise :class:`NoExactState`: this env has no exact state."""
        raise NoExactState(
            f"{type(self).__name__} declares exact_state = False: its state cannot be "
            "snapshotted or restored; reset it instead of restoring a capsule"
        )

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`NoExactState`: this env has no exact state."""
        self.get_state()


def _layers(env: gym.Env) -> tuple[list[gym.Wrapper], gym.Env]:
    layers = []
    while isinstance(env, gym.Wrapper):
        layers.append(env)
        env = env.env
    return layers, env


def env_name(env) -> str:
    """What to call ``env`` in a recording and a message: its registered id, else its innermost class's name."""
    return getattr(getattr(env, "spec", None), "id", None) or type(getattr(env, "unwrapped", env)).__name__


def find_exact_state(env: gym.Env) -> Any:
    """Return the layer of ``env`` that implements ``get_state`` / ``set_state`` exactly.

    Walks inward through wrappers known to be stateless; the first layer that
    says ``exact_state`` decides.

    Raises:
        NoExactState: no such layer, with the reason and the fix.
    """
    e = env
    while True:
        flag = getattr(e, "exact_state", None)
        if isinstance(flag, bool):
            if flag:
                return e
            reason = getattr(e, "exact_state_reason", f"{type(e).__name__} declares exact_state = False")
            raise NoExactState(reason)
        if isinstance(e, gym.Wrapper) and isinstance(e, STATELESS_WRAPPERS):
            e = e.env
            continue
        what = type(e).__name__
        raise NoExactState(
            f"{what} does not declare exact state"
            + (" (a TimeLimit or other wrapper holds state outside the env)" if isinstance(e, gym.Wrapper) else "")
            + "; wrap the env with rollcap.envs.ExactStateWrapper"
        )


def exact_state_of(env: gym.Env) -> Any | None:
    """The layer of ``env`` with exact ``get_state`` / ``set_state``, or None.

    The one detector of the code base (the host, replay and the check suite all
    ask it): :func:`find_exact_state` without the exception.
    """
    try:
        return find_exact_state(env)
    except NoExactState:
        return None


def declares_exact_state(env: gym.Env) -> bool:
    """True if ``env`` (through stateless wrappers) restores its state exactly."""
    return exact_state_of(env) is not None


def physics_row(state: Mapping[str, Any]) -> np.ndarray:
    """The flat physics vector of an exact state (robomimic's per-step ``states`` row).

    ``state["mj_state"]`` (MuJoCo's ``mjSTATE_INTEGRATION``) as float64; an
    empty vector for a state without one.
    """
    s = state.get("mj_state")
    return np.zeros(0, np.float64) if s is None else np.asarray(s, dtype=np.float64)


class ExactStateWrapper(gym.Wrapper):
    """Exact ``get_state`` / ``set_state`` and the ``Stateful`` protocol for any MuJoCo env.

    State layout (MuJoCo mode, :data:`MUJOCO_LAYOUT` 3): ``mj_state`` float64
    ``(n,)`` (``mjSTATE_INTEGRATION``), ``mj_xpos`` and ``mj_xipos`` float64
    ``(nbody, 3)``, ``mj_xquat`` float64 ``(nbody, 4)``, ``task.<name>`` for
    each task attribute (:mod:`rollcap.envs.task_state`; Fetch: ``task.goal``
    float64 ``(3,)``), ``model_digest`` uint8 ``(32,)`` (sha256 of the compiled
    MJB), ``rng`` uint64 ``(7,)`` (``env.unwrapped.np_random``) and, when the
    chain has ``TimeLimit`` wrappers, ``time_limit_steps`` int64 ``(k,)``
    (-1 = not reset yet). Over an env with native exact state: that env's
    entries plus ``time_limit_steps``.

    Why the derived body frames: after ``mj_step`` the derived arrays of
    ``mjData`` describe the start of the last substep, one substep behind
    ``qpos``. Ant-v5 reads the torso's ``xpos`` and Humanoid-v5 the bodies'
    ``xipos`` *before* they simulate (for the x velocity in the reward), and
    Fetch the gripper's ``xpos`` and ``xquat`` (to place its mocap body), so a
    restore that only recomputes them (``mj_forward``) changed their first
    step. Measured over all gymnasium MuJoCo v5 envs: a restore of the
    integration state plus ``xpos`` and ``xipos`` continues byte-identically
    (observations, rewards, flags, info, later resets), and dropping either
    breaks Ant or Humanoid; ``mj_step`` reads no derived array. So the state is
    the smallest that is exact there (10 floats per body more), not all of
    ``mjData``. The restore still runs ``mj_forward`` first, so every other
    derived array (contacts, ``geom_xpos``, what a renderer draws) belongs to
    the restored state, never to the state the env held before; then it sets
    the integration state again (``mj_forward`` of MuJoCo < 3.3.6 rewrites the
    warm start) and copies the derived frames back.

    First use (the first ``exact_state``, ``get_state``, ``set_state`` or
    fingerprint) checks the restore once per instance, on a copy of the env
    (:func:`rollcap.envs.probe.restore_difference`; the live env is not
    touched): an env whose state reads back changed, or whose observations,
    rewards, flags or info after a restore differ from the original steps, gets
    ``exact_state = False`` and a reason naming the key and the size of the
    difference. The copy is also where the state's layout is taken, after a
    ``reset()`` (Fetch's goal only gets its shape there).

    Non-finite float actions raise :class:`BadAction` before the env steps.
    A restore counts as a reset for ``OrderEnforcing`` and ``PassiveEnvChecker``
    layers (so a never-reset env can step after it). Put it outermost.

    Args:
        env: the env to wrap (e.g. ``gym.make("Pusher-v5")``).
        extra_stateless: further wrapper classes you vouch hold no state.
        task_attributes: further attributes of ``env.unwrapped`` that hold task
            state (arrays or numbers), beside those of its family.
        verify: run the first-use restore check. ``False`` vouches for the env
            unchecked (one that cannot be deep-copied, say); ``check_env_exact``
            still checks it.
    """

    def __init__(
        self,
        env: gym.Env,
        extra_stateless: tuple[type, ...] = (),
        task_attributes: tuple[str, ...] = (),
        verify: bool = True,
    ) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"ExactStateWrapper wraps a gymnasium.Env, got {type(env).__name__}")
        if not all(isinstance(t, type) for t in extra_stateless):
            raise TypeError(f"extra_stateless must be wrapper classes, got {extra_stateless!r}")
        if isinstance(task_attributes, str):
            raise TypeError(f"task_attributes must be a tuple of names, got the string {task_attributes!r}")
        if not isinstance(verify, bool):
            raise TypeError(f"verify must be True or False, got {verify!r}")
        super().__init__(env)
        layers, base = _layers(env)
        self._extra_stateless = tuple(extra_stateless)
        self._verify = verify
        self._time_limits = [w for w in layers if isinstance(w, gw.TimeLimit)]
        self._orders = [w for w in layers if isinstance(w, gw.OrderEnforcing)]
        self._checkers = [w for w in layers if isinstance(w, gw.PassiveEnvChecker)]
        known = (gw.TimeLimit, *STATELESS_WRAPPERS, *extra_stateless)
        unknown = [type(w).__name__ for w in layers if not isinstance(w, known)]
        self._native = bool(getattr(base, "exact_state", False)) and hasattr(base, "get_state")
        self._task_names = () if self._native else task_attributes_of(base, task_attributes)
        self._task_kinds: dict[str, str] = {}
        is_mujoco = isinstance(getattr(base, "model", None), mujoco.MjModel) and isinstance(
            getattr(base, "data", None), mujoco.MjData
        )
        name = type(base).__name__
        self._refusal = ""
        if unknown:
            self._refusal = (
                f"wrappers {unknown} around {name} may hold state this adapter cannot capture; "
                "pass extra_stateless=(TheirClass, ...) if they hold none"
            )
        elif not (self._native or is_mujoco):
            self._refusal = (
                f"{name} has neither a MuJoCo model/data nor a native get_state(); its state cannot be captured exactly"
            )
        self._spec: dict = {}
        self._checked = bool(self._refusal)
        if self._native and not self._refusal:
            self._spec, self._checked = spec_of(self._collect()), True  # the env vouches for its own state

    # -- first use -------------------------------------------------------------------
    @property
    def exact_state(self) -> bool:
        """Whether this env restores exactly (the first read runs the restore check)."""
        self._first_use()
        return not self._refusal

    @property
    def exact_state_reason(self) -> str:
        """Why ``exact_state`` is False, in one line; ``""`` when it is True."""
        self._first_use()
        return self._refusal

    def _first_use(self) -> None:
        """Take the state layout on a reset copy of the env and check a restore there; once per instance."""
        if self._checked:
            return
        self._checked = True
        name = type(self.env.unwrapped).__name__
        try:
            twin = ExactStateWrapper(clone_env(self.env), self._extra_stateless, self._task_names, verify=False)
        except Exception as err:  # noqa: BLE001 - any env may fail to copy; the reason says how
            if self._verify:
                self._refusal = (
                    f"{name} could not be copied to check its restores ({type(err).__name__}: {err}); "
                    "pass verify=False to vouch for them, and run check_env_exact"
                )
                return
            twin = None
        try:
            if twin is None:
                self._adopt_layout()
                return
            twin._checked = True
            with warnings.catch_warnings():  # gymnasium's checkers warn about the copy, not the live env
                warnings.simplefilter("ignore")
                twin.reset(seed=PROBE_SEED)
                twin._adopt_layout()
                self._spec, self._task_kinds = twin._spec, twin._task_kinds
                why = restore_difference(twin) if self._verify else None
            if why:
                self._refusal = (
                    f"{name} does not restore exactly: {why} (captured: MuJoCo's integration state, derived "
                    f"{sorted(MJ_DERIVED)}, task attributes {list(self._task_names)}; if the env keeps task state "
                    "in other attributes, name them with task_attributes=(...))"
                )
        except NoExactState as err:
            self._refusal = str(err)
        except Exception as err:  # noqa: BLE001 - an env that fails on its copy cannot be vouched for
            self._refusal = f"checking {name}'s restores on a copy raised {type(err).__name__}: {err}"
        finally:
            if twin is not None:
                twin.close()

    def _adopt_layout(self) -> None:
        """Take the state layout and the task attributes' kinds from this env as it is now."""
        self._spec = spec_of(self._collect())
        self._task_kinds = get_task_state(self.env.unwrapped, self._task_names)[1]

    # -- gymnasium ---------------------------------------------------------------------
    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        """Refuse a non-finite float action before it reaches the simulator, then step.

        Raises:
            BadAction: the action holds NaN or Inf (the env's state is unchanged).
        """
        a = np.asarray(action)
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            raise BadAction(
                f"action has non-finite values {a.tolist()}; the simulator was not stepped "
                "(check the policy output for NaN/Inf)"
            )
        return self.env.step(action)

    # -- state -------------------------------------------------------------------------
    def _collect(self) -> dict[str, np.ndarray]:
        base = self.env.unwrapped
        if self._native:
            state = dict(base.get_state())
        else:
            task = get_task_state(base, self._task_names)[0]
            state = {
                "mj_state": get_mj_state(base.model, base.data),
                **get_mj_derived(base.data),
                **task,
                "model_digest": np.frombuffer(model_digest_of(base), dtype=np.uint8).copy(),
                "rng": rng_to_array(base.np_random),
            }
        if self._time_limits:
            steps = [-1 if w._elapsed_steps is None else w._elapsed_steps for w in self._time_limits]
            state["time_limit_steps"] = np.array(steps, dtype=np.int64)
        return state

    def _digest(self) -> bytes:
        base = self.env.unwrapped
        if self._native:
            return bytes(base.get_state()["model_digest"])
        return model_digest_of(base)

    def get_state(self) -> dict[str, np.ndarray]:
        """Return fresh copies of the env's exact state (layout in the class docstring).

        Raises:
            NoExactState: this env cannot be captured (see ``exact_state_reason``),
                or a task attribute does not have its after-reset shape yet
                (reset the env first).
        """
        if not self.exact_state:
            raise NoExactState(self.exact_state_reason)
        state = self._collect()
        for key in state.keys() & self._spec.keys():
            if key.startswith(TASK_PREFIX) and (state[key].dtype, state[key].shape) != self._spec[key]:
                dtype, shape = self._spec[key]
                raise NoExactState(
                    f"{type(self.env.unwrapped).__name__}.{key.removeprefix(TASK_PREFIX)} is "
                    f"{state[key].dtype}{list(state[key].shape)} now and {np.dtype(dtype)}{list(shape)} after reset(); "
                    "reset the env before taking its state"
                )
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`get_state`; validates everything before the first write.

        Raises:
            NoExactState: this env cannot be restored.
            StateMismatch: the state is from another env or model, or of an older layout.
        """
        if not self.exact_state:
            raise NoExactState(self.exact_state_reason)
        owner = f"ExactStateWrapper({type(self.env.unwrapped).__name__})"
        try:
            s = validate_state(state, self._spec, self._digest(), owner)
        except StateMismatch as err:
            self._refuse_old_layout(state, owner, err)
            raise
        base = self.env.unwrapped
        limits = s.pop("time_limit_steps", None)
        if self._native:
            base.set_state(s)  # validates its own entries before writing
        else:
            rng_state = rng_state_from_array(s["rng"], base.np_random)
            set_task_state(base, s, self._task_kinds)  # first: task state may be model arrays mj_forward reads
            set_mj_state(base.model, base.data, s["mj_state"], {k: s[k] for k in MJ_DERIVED})
            base.np_random.bit_generator.state = rng_state
        if limits is not None:
            for w, n in zip(self._time_limits, limits.tolist()):
                w._elapsed_steps = None if n < 0 else int(n)
        for w in self._orders:
            w._has_reset = True
        for w in self._checkers:
            if not w.checked_reset:  # its first-step check needs a reset's data; skip it
                w.checked_reset = w.checked_step = w.checked_data_reuse = True

    def _refuse_old_layout(self, state: Mapping[str, Any], owner: str, err: StateMismatch) -> None:
        """Name a MuJoCo-mode state of an older layout (this model, fewer entries) for what it is."""
        if self._native or not isinstance(state, Mapping) or "mj_state" not in state:
            return
        digest = np.asarray(state.get("model_digest", np.zeros(0, np.uint8)))
        if digest.dtype != np.uint8 or digest.tobytes() != self._digest():
            return
        for layout, lacks in _OLD_LAYOUTS.items():
            if not (lacks & set(state)) and not any(str(k).startswith(TASK_PREFIX) for k in state):
                raise StateMismatch(
                    f"{owner}: state has ExactStateWrapper's old layout {layout} (no {sorted(lacks)}), "
                    f"this version restores layout {MUJOCO_LAYOUT}; an old-layout state cannot restore envs that read "
                    "those arrays (or keep task state) exactly, so it is not half-applied: take a new snapshot"
                ) from err

    def live_state(self) -> dict[str, np.ndarray]:
        """``Stateful``: the same as :meth:`get_state`."""
        return self.get_state()

    def load_live_state(self, state: Mapping[str, Any]) -> None:
        """``Stateful``: the same as :meth:`set_state`."""
        self.set_state(state)

    def state_fingerprint(self) -> dict:
        """``Stateful``: env id, MuJoCo version, model digest, layout, task attributes and state spec (JSON-able).

        ``state_layout`` (:data:`MUJOCO_LAYOUT`) and ``task_attributes`` (name ->
        kind) are there in MuJoCo mode only; over a native env the fingerprint is
        that env's, plus ``state_spec`` and ``time_limits``; ``step_limit`` when the
        base env declares ``rollcap_step_limit`` (the steps after which it truncates itself).
        """
        if not self.exact_state:
            raise NoExactState(self.exact_state_reason)
        base = self.env.unwrapped
        if self._native:
            fp = dict(base.state_fingerprint())
        else:
            spec = getattr(base, "spec", None)
            fp = {
                "env_id": spec.id if spec is not None else type(base).__name__,
                "mujoco": mujoco.__version__,
                "model_digest": "sha256:" + self._digest().hex(),
                "state_layout": MUJOCO_LAYOUT,
                "task_attributes": dict(self._task_kinds),
            }
        fp["state_spec"] = spec_to_json(self._spec)
        fp["time_limits"] = [w._max_episode_steps for w in self._time_limits]
        if getattr(base, "rollcap_step_limit", None):  # an env that truncates itself (MetaWorld's max_path_length)
            fp["step_limit"] = int(base.rollcap_step_limit)
        return fp
