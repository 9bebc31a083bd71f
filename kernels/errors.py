"""Errors raised by the execution substrate."""

from __future__ import annotations


class BadInput(ValueError):
    """A value offered to a static buffer has the wrong name, shape, dtype or values.

    Raised before anything is copied or launched, so live buffers are untouched.
    """


class CaptureError(RuntimeError):
    """A graph could not be warmed up, captured or replayed in its current phase."""


class ReplayInFlight(RuntimeError):
    """A runner's buffers were written or read, or a replay launched, while its last replay is in flight.

    Call ``wait()`` for its result, or ``drain()`` to discard it, first.
    """


class LaneError(RuntimeError):
    """Work submitted to a lane failed; the lane's original exception is chained."""


class CheckpointMismatch(ValueError):
    """A checkpoint's config or tensors do not match what the loader expects."""


class CaptureHazard(CaptureError):
    """A function about to be captured does what a captured graph cannot replay faithfully.

    A tensor built from host data, a host sync (``.item()``, ``.cpu()``, ``.numpy()``), a data-dependent
    shape, or a random draw; the message names the operation and the function's line. Raised by the
    capture guard (:mod:`rollcap.kernels.guard`) on any device, before anything is captured.
    """
