"""Errors raised by rollcap envs."""

from __future__ import annotations


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
