"""Errors of the rollout host, recordings and replay."""

from __future__ import annotations


class RolloutError(Exception):
    """Base class of rollcap.rollout errors."""


class CorruptEpisode(RolloutError):
    """A recording is truncated, corrupted, of an unknown format version, or not a recording."""


class IllegalTransition(RolloutError):
    """The host was asked to do something its current state does not allow."""
