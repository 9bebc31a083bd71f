"""Errors and warnings raised by rollcap envs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


class BadAction(ValueError):
    """An action has the wrong shape or non-finite values.

    Raised before the simulator is touched, so its state is unchanged.
    """


class StateMismatch(ValueError):
    """A state offered to ``set_state`` does not belong to this env or model.

    Raised after validation and before the first copy, so the simulator,
    RNG and counters are unchanged.
    """


class NoExactState(RuntimeError):
    """This env cannot snapshot or restore its state exactly (``exact_state`` is False)."""


class RenderUnavailable(RuntimeError):
    """The requested renderer cannot run in this process (no OpenGL backend)."""


class CheckFailed(AssertionError):
    """An env failed a check of :func:`rollcap.envs.checks.check_env_exact`."""


_SAID: set[str] = set()
"""The MuJoCo warnings this process has issued (:func:`mujoco_warnings`)."""


class MujocoWarning(UserWarning):
    """A warning MuJoCo gave while a model was built, as a Python warning (:func:`mujoco_warnings`)."""


@contextlib.contextmanager
def mujoco_warnings(where: str) -> Iterator[None]:
    """MuJoCo's warnings inside the block become :class:`MujocoWarning` s naming ``where``, issued as it ends,
    each text once a process (a model compiled again, e.g. an env's copy, says the same).

    MuJoCo's own handler prints them and appends them to ``MUJOCO_LOG.TXT`` in the working directory: a file left
    wherever a user ran a command (gymnasium 1.4's ``HalfCheetah-v5`` model uses ``settotalmass``, deprecated in
    MuJoCo 4). The handler is MuJoCo's one global, restored on exit; the warnings are issued after the C call
    returns, so a filter that makes them errors raises in Python, not inside MuJoCo.
    """
    import mujoco

    said: list[str] = []
    before = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(said.append)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(before)
        for msg in dict.fromkeys(said):
            if msg not in _SAID:
                _SAID.add(msg)
                warnings.warn(f"{where}: MuJoCo: {msg}", MujocoWarning, stacklevel=3)
