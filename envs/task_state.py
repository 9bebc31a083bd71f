"""Task state that envs keep outside MuJoCo's state, captured by value.

A goal-conditioned env samples its goal at ``reset()`` and keeps it in a
Python attribute (gymnasium-robotics' Fetch: ``env.goal``), so MuJoCo's
integration state alone restores the arm and the block but not the task: after
a restore the observation's ``desired_goal`` is the goal of whatever the env
did last. :class:`~rollcap.envs.ExactStateWrapper` captures the attributes
named for the env's family in :data:`TASK_ATTRIBUTES`, those the env names
itself in ``rollcap_task_attributes``, and those passed as ``task_attributes=``
— each as a numpy array entry ``task.<name>`` of the state.

What can be captured: numeric or bool numpy arrays, and numbers (``bool``,
``int``, ``float``, numpy scalars). Each comes back as the kind it was (a fresh
array, or a number of the same type). Anything else (lists, objects) is refused
by name: give the env an array attribute instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rollcap.envs.errors import NoExactState

TASK_PREFIX = "task."
"""State entries of task attributes are named ``task.<attribute>``."""

TASK_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    # Every gymnasium-robotics robot env (Fetch, Shadow hand) samples its goal
    # in reset() and keeps it here; the observation's desired_goal reads it.
    "gymnasium_robotics.envs.robot_env.BaseRobotEnv": ("goal",),
    # MetaWorld's Sawyer tasks: the step counter that truncates, the previous
    # observation stacked into the next, the task variation and the goal and
    # object positions it placed (reward terms read them). Each task keeps more
    # (reward normalisers, initial poses) and moves bodies and sites of its
    # model at reset: rollcap/MetaWorld-* envs name those themselves
    # (rollcap.envs.metaworld).
    "metaworld.sawyer_xyz_env.SawyerXYZEnv": (
        "curr_path_length",
        "_prev_obs",
        "_last_rand_vec",
        "_target_pos",
        "obj_init_pos",
    ),
}
"""Env family -> attributes that hold task state outside MuJoCo's state.

A family is the ``module.QualName`` of a class in the env's MRO, so one entry
covers every env derived from it. Add an entry here for a benchmark family
whose envs rollcap should restore exactly; an env of your own names its
attributes in a class attribute ``rollcap_task_attributes`` instead, and a
caller can add more with ``ExactStateWrapper(env, task_attributes=(...))``.
The wrapper's first-use check refuses exactness for an env whose observations
still differ after a restore, so a missing entry is reported, not silent."""

KINDS = ("ndarray", "bool", "int", "float", "numpy")
"""How a captured attribute comes back: a fresh array, or a number of that type."""

_INT64 = np.iinfo(np.int64)


def task_attributes_of(env: Any, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The task attributes of ``env`` (the unwrapped env): its families', its own, then ``extra``; no repeats.

    Raises:
        TypeError: a name is not an attribute identifier.
    """
    names: list[str] = []
    for cls in type(env).__mro__:
        names += TASK_ATTRIBUTES.get(f"{cls.__module__}.{cls.__qualname__}", ())
    names += tuple(getattr(env, "rollcap_task_attributes", ()))
    names += tuple(extra)
    for n in names:
        if not isinstance(n, str) or not n.isidentifier():
            raise TypeError(f"task attributes must be attribute names, got {n!r}")
    return tuple(dict.fromkeys(names))


def kind_of(value: Any, where: str) -> str:
    """The :data:`KINDS` entry of a live attribute value.

    Raises:
        NoExactState: the value cannot be captured by value.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc" or value.dtype.hasobject:
            raise NoExactState(
                f"task attribute {where} is a {value.dtype} array; only numeric and bool arrays can be captured"
            )
        return "ndarray"
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return "numpy"
    for kind, typ in (("bool", bool), ("int", int), ("float", float)):
        if isinstance(value, typ):
            return kind
    raise NoExactState(
        f"task attribute {where} is a {type(value).__name__}, which cannot be captured by value "
        "(numeric arrays and numbers only); keep that task state in a numpy array"
    )


def get_task_state(env: Any, names: Iterable[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Copies of the task attributes of ``env`` as state entries, and the kind of each attribute.

    Raises:
        NoExactState: an attribute is missing or cannot be captured by value.
    """
    state, kinds = {}, {}
    owner = type(env).__name__
    for name in names:
        where = f"{owner}.{name}"
        if not hasattr(env, name):
            raise NoExactState(
                f"task attribute {where} does not exist; check the name (a family entry or task_attributes=)"
            )
        value = getattr(env, name)
        kind = kinds[name] = kind_of(value, where)
        if kind == "int" and not (_INT64.min <= value <= _INT64.max):
            raise NoExactState(f"task attribute {where} = {value} does not fit an int64")
        dtype = {"bool": np.bool_, "int": np.int64, "float": np.float64}.get(kind)
        state[TASK_PREFIX + name] = np.array(value, dtype=dtype, copy=True)
    return state, kinds


def set_task_state(env: Any, state: Mapping[str, np.ndarray], kinds: Mapping[str, str]) -> None:
    """Set each task attribute of ``env`` from its (validated) state entry, as the kind it was captured as."""
    for name, kind in kinds.items():
        value = np.asarray(state[TASK_PREFIX + name])
        if kind == "ndarray":
            restored: Any = np.array(value, copy=True)
        elif kind == "numpy":
            restored = value.dtype.type(value[()])
        else:
            restored = {"bool": bool, "int": int, "float": float}[kind](value[()])
        setattr(env, name, restored)
