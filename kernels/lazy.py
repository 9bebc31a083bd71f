"""Package names imported on first use, so importing a package imports none of its heavy modules.

A package that lists its public names in ``__init__`` would import every module
behind them (and torch with most) the moment anything under it is imported: an
env worker that needs one numpy helper would pay torch's 1.8 s and 200 MB.
:func:`lazy_names` gives such a package a module ``__getattr__`` (PEP 562) that
imports a name's module when the name is first asked for, and a ``__dir__``
that lists the names. This module imports nothing of rollcap.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_names(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose name ``n`` lives in its module ``names[n]``.

    Example (a package's ``__init__``)::

        _NAMES = {"BufferSet": "buffers", "tensor_digest": "fingerprint"}
        __all__ = sorted(_NAMES)
        __getattr__, __dir__ = lazy_names(__name__, _NAMES)
    """

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
