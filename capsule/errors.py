"""Errors raised by capsules, their tiers and the registry.

Every message is one line: what was expected, what arrived, what to do. Each
is raised before the first byte is copied into a live buffer, so a refused
restore leaves the live components exactly as they were.
"""

from __future__ import annotations

from typing import Any


class CapsuleError(Exception):
    """Base class of every capsule error."""


class CapsuleMismatch(CapsuleError, ValueError):
    """A capsule does not fit the live components it is restored into.

    Raised for a differing deployment-fingerprint field and for a component
    or buffer that is missing, extra, or of another shape, dtype or kind.

    Attributes:
        component: the component concerned (``None`` for the component set).
        field: the fingerprint field or buffer name that differs.
        expected: the capsule's value.
        got: the live component's value.
    """

    def __init__(
        self,
        message: str,
        *,
        component: str | None = None,
        field: str | None = None,
        expected: Any = None,
        got: Any = None,
    ):
        super().__init__(message)
        self.component = component
        self.field = field
        self.expected = expected
        self.got = got


class CorruptCapsule(CapsuleError):
    """A capsule's bytes or manifest are damaged: a digest differs, a file or
    buffer is missing, or the manifest is truncated or malformed.

    Attributes:
        path: the capsule directory or file concerned, if on disk.
    """

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class RegistryFull(CapsuleError):
    """Pinned capsules would exceed a tier's byte budget (pinned ones are never evicted)."""


class UnknownBoundary(CapsuleError, LookupError):
    """A rollback named a boundary that is not (or no longer) in the session's history."""
