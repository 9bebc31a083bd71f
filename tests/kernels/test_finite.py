"""all_finite: the same answer as ``np.isfinite(a).all()`` for every array, the overflowing and odd ones included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.kernels.finite import all_finite


def _cases():
    chunk = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
    for bad in (np.nan, np.inf, -np.inf, 3e38, -3e38, 1e20, 1e-45, -0.0, 0.0):  # non-finite, overflowing squares, tiny
        for dtype in (np.float16, np.float32, np.float64):
            a = chunk.astype(dtype)
            with np.errstate(over="ignore"):  # 3e38 is Inf in float16
                a[5, 1] = bad
            yield a
    yield np.zeros((0, 2), np.float32)  # empty
    yield np.full((3,), np.finfo(np.float32).max, np.float32)
    yield np.ones((4, 4), np.float32)[:, ::2]  # not contiguous
    yield np.float64("inf")
    yield np.array([1, 2, 3])  # ints: always finite
    yield np.array([True, False])
    yield np.array([1 + 1j, complex("nan")])  # complex: the plain check
    yield [1.0, float("nan")]  # what np.asarray takes
    yield torch.tensor([1.0, float("inf")])


@pytest.mark.filterwarnings("error")  # an overflowing sum of squares is no warning
@pytest.mark.parametrize("a", list(_cases()), ids=lambda a: f"{type(a).__name__}-{getattr(a, 'dtype', '')}")
def test_all_finite_is_isfinite_all(a):
    want = bool(np.isfinite(np.asarray(a)).all())
    assert all_finite(a) is want
