"""Shared test setup: the ``cuda`` marker skips cleanly without a GPU; signal handlers are restored after each test."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Each test starts with pytest's SIGINT / SIGTERM handlers and leaves them so.

    The CLI's ``main()`` ends by ignoring both (a process about to exit must not
    die by a late signal); tests that call it in-process would otherwise leave
    Ctrl-C ignored for every later test.
    """
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)
