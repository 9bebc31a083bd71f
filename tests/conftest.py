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
    """Under ``-n 2 --dist loadfile`` (the README's command) hand out the heaviest modules first.

    xdist gives each worker whole modules in collection order; a heavy module (Ray clusters, subprocess replays)
    dealt last runs alone while the other worker idles. A module's weight is its tests' expected seconds: a slow
    test's ``seconds`` when its marker gives one, else 3; any other test 0.1. Every worker sorts the same way, so
    the order agrees.
    """

    def module(item) -> str:
        return item.nodeid.split("::")[0]

    def seconds(item) -> float:
        mark = item.get_closest_marker("slow")
        return 0.1 if mark is None else float(mark.kwargs.get("seconds", 3))

    weight: dict[str, float] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(module(item), i)
        weight[module(item)] = weight.get(module(item), 0.0) + seconds(item)
    items.sort(key=lambda item: (-weight[module(item)], first[module(item)]))  # stable: a module's own order is kept


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
