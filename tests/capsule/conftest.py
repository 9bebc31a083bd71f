"""Fixtures of the capsule tests: a world of a captured tiny policy and a numpy toy sim."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the helper module sits beside the tests (import-mode=importlib)
    sys.path.insert(0, str(HERE))

import _capsule_components as comps  # noqa: E402


@pytest.fixture(params=["eager", "jit"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def world(backend) -> dict:
    """A fresh policy (on ``backend``) + sim, advanced two chunks so no buffer is zero."""
    w = comps.make_world(backend)
    comps.run_chunk(w, 0)
    comps.run_chunk(w, 1)
    return w


@pytest.fixture
def eager_world() -> dict:
    """Like ``world`` on the eager backend only, for tests where the backend does not matter."""
    w = comps.make_world("eager")
    comps.run_chunk(w, 0)
    comps.run_chunk(w, 1)
    return w
