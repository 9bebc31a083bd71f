"""Exact-state helpers shared by the built-in envs and the adapters.

A state is a flat ``dict[str, np.ndarray]`` (no pickle, no Python objects):
MuJoCo's ``mjSTATE_INTEGRATION`` vector, where needed copies of derived
``mjData`` arrays (:data:`MJ_DERIVED`), the env RNG as ``uint64`` words,
counters as ``int64`` and a ``model_digest`` as 32 ``uint8`` bytes, so a
state from another model is refused by digest, not by luck of sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import mujoco
import numpy as np

from rollcap.envs.errors import NoExactState, StateMismatch

MJ_STATE_SIG = int(mujoco.mjtState.mjSTATE_INTEGRATION)
"""State signature used everywhere: positions, velocities, actuation, controls,
applied forces, mocap, user data and the solver warmstart (restores exactly)."""

MJ_DERIVED: dict[str, str] = {"mj_xpos": "xpos", "mj_xipos": "xipos", "mj_xquat": "xquat"}
"""State entry -> ``mjData`` field of the derived arrays a restore puts back as taken.

After ``mj_step`` these hold the body frames (``xpos``, ``xquat``) and centres
of mass (``xipos``) of the *last substep's start*, one substep behind ``qpos``;
a restore's ``mj_forward`` would make them current instead. Envs that read them
before stepping (gymnasium's Ant-v5: ``xpos`` of the torso; Humanoid-v5:
``xipos`` for the centre of mass; gymnasium-robotics' Fetch: ``xpos`` and
``xquat`` of the gripper, to move its mocap body) then see other values than in
the run that was never interrupted. ``mj_step`` itself reads none of the
derived arrays."""

StateSpec = dict[str, tuple[np.dtype, tuple[int, ...]]]
"""Name -> (dtype, shape) of every entry of a state dict."""

_RNG_KINDS = ("PCG64", "PCG64DXSM")
_MASK64 = (1 << 64) - 1


def get_mj_state(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    """Return a fresh float64 copy of the ``mjSTATE_INTEGRATION`` state."""
    out = np.empty(mujoco.mj_stateSize(model, MJ_STATE_SIG), dtype=np.float64)
    mujoco.mj_getState(model, data, out, MJ_STATE_SIG)
    return out


def get_mj_derived(data: mujoco.MjData) -> dict[str, np.ndarray]:
    """Return fresh float64 copies of the :data:`MJ_DERIVED` arrays, keyed by state entry."""
    return {key: np.array(getattr(data, field), dtype=np.float64) for key, field in MJ_DERIVED.items()}


def set_mj_state(
    model: mujoco.MjModel,
    data: mujoco.MjData,
    state: np.ndarray,
    derived: Mapping[str, np.ndarray] | None = None,
) -> None:
    """Copy an integration state into ``data``, recompute derived quantities, put back ``derived``.

    ``mj_forward`` recomputes the derived fields (positions of bodies, contacts,
    accelerations), so no derived value of the state ``data`` held before
    survives. It may also write into the integration state: MuJoCo before 3.3.6
    saves the solver's result in ``qacc_warmstart`` at the end of every forward
    pass (in models with constraints that changed the warm start, and so the
    next step, by ~1e-12), and a control callback (``mjcb_control``) writes
    ``ctrl``. So the integration state is set again after ``mj_forward``: it
    reads back exactly as given. ``derived`` (entries of
    :func:`get_mj_derived`) is then copied in place over what ``mj_forward``
    computed, so those arrays read as when the state was taken.
    """
    state = np.ascontiguousarray(state, dtype=np.float64)
    mujoco.mj_setState(model, data, state, MJ_STATE_SIG)
    mujoco.mj_forward(model, data)
    mujoco.mj_setState(model, data, state, MJ_STATE_SIG)
    for key, value in (derived or {}).items():
        getattr(data, MJ_DERIVED[key])[...] = value


def compiled_model_digest(model: mujoco.MjModel) -> bytes:
    """sha256 (32 bytes) of the compiled model as MJB bytes."""
    buf = np.zeros(mujoco.mj_sizeModel(model), dtype=np.uint8)
    mujoco.mj_saveModel(model, None, buf)
    return hashlib.sha256(buf.tobytes()).digest()


def model_digest_of(env: object) -> bytes:
    """sha256 (32 bytes) of an env's model: its own ``rollcap_model_digest()`` if it has one, else the compiled MJB's.

    An env whose model arrays change at reset (MetaWorld moves bodies and sites
    to place a task variation) captures those arrays as task state and digests
    its model with them masked; the digest still names the model.
    """
    own = getattr(env, "rollcap_model_digest", None)
    return bytes(own()) if callable(own) else compiled_model_digest(env.model)


def rng_to_array(gen: np.random.Generator) -> np.ndarray:
    """Serialise a PCG64/PCG64DXSM generator's state into 7 ``uint64`` words.

    Layout: ``[kind, state_hi, state_lo, inc_hi, inc_lo, has_uint32, uinteger]``
    with kind 0 = PCG64, 1 = PCG64DXSM.

    Raises:
        NoExactState: the generator uses another bit generator.
    """
    st = gen.bit_generator.state
    kind = st.get("bit_generator")
    if kind not in _RNG_KINDS:
        raise NoExactState(
            f"cannot serialise a {kind} bit generator; expected one of {_RNG_KINDS} "
            "(seed the env through reset(seed=...) so it uses PCG64)"
        )
    s, inc = int(st["state"]["state"]), int(st["state"]["inc"])
    words = [
        _RNG_KINDS.index(kind),
        s >> 64,
        s & _MASK64,
        inc >> 64,
        inc & _MASK64,
        int(st["has_uint32"]),
        int(st["uinteger"]),
    ]
    return np.array(words, dtype=np.uint64)


def rng_state_from_array(arr: np.ndarray, gen: np.random.Generator) -> dict:
    """Decode :func:`rng_to_array` words into a state dict for ``gen``'s bit generator.

    Raises:
        StateMismatch: the words name another bit generator kind than ``gen`` uses.
    """
    w = [int(x) for x in np.asarray(arr, dtype=np.uint64)]
    if w[0] >= len(_RNG_KINDS):
        raise StateMismatch(f"rng word 0 (kind) is {w[0]}; expected 0 (PCG64) or 1 (PCG64DXSM)")
    kind = _RNG_KINDS[w[0]]
    have = gen.bit_generator.state.get("bit_generator")
    if kind != have:
        raise StateMismatch(f"state holds a {kind} RNG but this env uses {have}")
    return {
        "bit_generator": kind,
        "state": {"state": (w[1] << 64) | w[2], "inc": (w[3] << 64) | w[4]},
        "has_uint32": w[5],
        "uinteger": w[6],
    }


def spec_of(state: Mapping[str, np.ndarray]) -> StateSpec:
    """Return the (dtype, shape) spec of a state dict."""
    return {k: (np.asarray(v).dtype, tuple(np.shape(v))) for k, v in state.items()}


def spec_to_json(spec: StateSpec) -> dict[str, list]:
    """JSON-able form of a spec: ``{name: [dtype_str, [dims...]]}``."""
    return {k: [str(np.dtype(d)), list(s)] for k, (d, s) in sorted(spec.items())}


def to_numpy(value: object) -> np.ndarray:
    """Return a numpy view of an ndarray or a (CPU-copied) torch tensor."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch here
        return value.detach().cpu().numpy()
    return np.asarray(value)


def validate_state(
    state: Mapping[str, object], spec: StateSpec, model_digest: bytes, owner: str
) -> dict[str, np.ndarray]:
    """Check a state against ``spec`` and the model digest; touch nothing.

    The digest is checked first since it names the root cause (a state from
    another model or env), then names, then dtypes and shapes.

    Returns:
        The entries as numpy arrays, in spec order.

    Raises:
        StateMismatch: with what was expected, what arrived, and the likely fix.
    """
    if not isinstance(state, Mapping):
        raise StateMismatch(f"{owner}: a state must be a mapping of arrays, got {type(state).__name__}")
    arrays = {k: to_numpy(v) for k, v in state.items()}
    got = arrays.get("model_digest")
    if got is not None and (got.dtype != np.uint8 or got.tobytes() != model_digest):
        raise StateMismatch(
            f"{owner}: state is from another MuJoCo model (model_digest "
            f"{got.tobytes().hex()[:12]}... != {model_digest.hex()[:12]}...); "
            "restore it into the env (and model) it was taken from"
        )
    missing = sorted(set(spec) - set(arrays))
    extra = sorted(set(arrays) - set(spec))
    if missing or extra:
        raise StateMismatch(
            f"{owner}: state entries differ: missing {missing}, unexpected {extra}; is this a state from another env?"
        )
    for name, (dtype, shape) in spec.items():
        a = arrays[name]
        if a.dtype != dtype or a.shape != shape:
            raise StateMismatch(
                f"{owner}: state entry {name!r} is {a.dtype}{list(a.shape)}, expected "
                f"{np.dtype(dtype)}{list(shape)}; is this a state from another env or model?"
            )
    return {name: arrays[name] for name in spec}
