"""Errors of the rollout host, recordings and replay."""

from __future__ import annotations

from pathlib import Path


class RolloutError(Exception):
    """Base class of rollcap.rollout errors."""


class CorruptEpisode(RolloutError):
    """A recording is truncated, corrupted, of an unknown format version, or not a recording."""


class IllegalTransition(RolloutError):
    """The host was asked to do something its current state does not allow."""


class ConfigError(RolloutError, ValueError):
    """A config field holds a value it cannot take; ``field`` names it (the CLI maps it to its flag)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class RecordingFailed(RolloutError):
    """Writing an episode failed (a full disk, a lost mount): the run stops; episodes written before are intact."""


class ClusterFailure(RolloutError):
    """The machines failed, not the user: a Ray node or actor was lost and retrying did not get past it (exit 1)."""


class NotExactWarning(UserWarning):
    """The env's episodes cannot be replayed byte for byte (not repeatable, or its exact state is missing); the run records anyway.

    ``rollcap run --require-exact`` (``require_exact=True``) refuses such an env instead.
    """


class ExportWarning(UserWarning):
    """An export wrote its dataset, and it lacks something its format recommends (who made it), or holds data its
    declared spaces do not contain (actions the env clipped): the one line says which and what to do."""


def cause_of(err: BaseException) -> str:
    """``Type: message`` of an exception, and where it was raised when the message is empty (a bare ``assert``)."""
    text = str(err).strip().splitlines()
    if text:
        return f"{type(err).__name__}: {text[0]}"
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (
        f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
        if tb is not None
        else ""
    )
    return f"{type(err).__name__}{where}"
