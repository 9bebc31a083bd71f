"""Comparing what envs return: canonical bytes, and the first difference named with its size."""

from __future__ import annotations

from typing import Any

import numpy as np


def canonical_bytes(x: Any) -> bytes:
    """Bytes that are equal iff two observations/rewards are identical (dtype, shape, values)."""
    if isinstance(x, dict):
        return b"{" + b"".join(k.encode() + b":" + canonical_bytes(x[k]) for k in sorted(x)) + b"}"
    if isinstance(x, (tuple, list)):
        return b"[" + b",".join(canonical_bytes(v) for v in x) + b"]"
    if isinstance(x, str):
        return b"s" + x.encode()
    if x is None:
        return b"None"
    a = np.asarray(x)
    if a.dtype.hasobject:  # tobytes() of an object array is its pointers
        return b"o" + repr(x).encode()
    return f"{a.dtype}{a.shape}".encode() + a.tobytes()


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bytes_per_value(x: np.ndarray) -> np.ndarray:
    """``(x.size, itemsize)`` uint8: the bytes of each value (a NaN payload or -0.0 counts as a difference)."""
    return np.ascontiguousarray(x).reshape(x.size, 1).view(np.uint8)


def difference(name: str, a: Any, b: Any) -> str | None:
    """``None`` if ``a`` and ``b`` are identical (:func:`canonical_bytes`), else one line naming the first part that differs.

    Dicts are compared key by key (sorted) and sequences item by item, so the
    line names the part (``observation['desired_goal']``) and, for numbers, by
    how much: ``differs by up to 0.0123 in 3 of 3 values``.
    """
    if canonical_bytes(a) == canonical_bytes(b):
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{name} keys differ: {sorted(map(str, set(a) ^ set(b)))}"
        for k in sorted(a):
            found = difference(f"{name}[{k!r}]", a[k], b[k])
            if found:
                return found
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = difference(f"{name}[{i}]", x, y)
            if found:
                return found
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"{name} is {y.dtype}{list(y.shape)}, was {x.dtype}{list(x.shape)}"
    if x.dtype.kind in "biufc" and not x.dtype.hasobject:
        wide = np.complex128 if x.dtype.kind == "c" else np.float64
        delta = np.abs(x.astype(wide) - y.astype(wide)).reshape(-1)
        n = int((_bytes_per_value(x) != _bytes_per_value(y)).any(axis=1).sum())
        finite = delta[np.isfinite(delta)]
        size = f"{finite.max():.3g}" if finite.size else "NaN"
        return f"{name} differs by up to {size} in {n} of {x.size} values"
    return f"{name} differs: {_clip(repr(a))} vs {_clip(repr(b))}"
