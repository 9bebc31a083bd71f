"""Shared test setup: the ``cuda`` marker skips cleanly without a GPU; signal handlers are restored after each test;
under xdist the heaviest modules go first."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _heaviest_modules_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def _heaviest_modules_first(items: list) -> None:
    """Under ``-n 2 --dist loadfile`` (the README's command) hand out the modules with the most slow tests first.

    xdist gives each worker whole modules in collection order; a heavy module (Ray clusters, subprocess replays)
    dealt last runs alone while the other worker idles. Every worker sorts the same way, so the order agrees.
    """
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(module(item), i)
        slow[module(item)] = slow.get(module(item), 0) + ("slow" in item.keywords)
    items.sort(key=lambda item: (-slow[module(item)], first[module(item)]))  # stable: a module's own order is kept


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
