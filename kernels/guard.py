"""The capture guard: what a captured function may not do, checked on any device.

CUDA graph capture refuses some operations outright (a tensor built from host
data is a host-to-device copy, refused unless the host memory is pinned; a
host sync such as ``.item()`` is refused) and silently freezes others (a draw
from the global RNG replays the same offsets; a data-dependent shape is fixed
at its capture-time value). A CPU plan (``jit``, ``aoti``, ``compile``) has the
same blind spots: ``torch.jit.trace`` stores a host-built tensor as a
constant and a value read as a Python number as a fixed branch. So every
function rollcap captures runs once under :func:`guarded` before capture, on
whatever device it lives on, and the first hazard is an error naming the
operation and the line of the function that made it.

Two interposition layers see what one alone misses on a CPU tensor:

- a :class:`~torch.overrides.TorchFunctionMode` sees the Python-level host
  reads that never reach the dispatcher on CPU (``.numpy()``, ``.tolist()``,
  ``.cpu()``, ``.to("cpu")`` of a device tensor);
- a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every ATen
  operation: ``lift_fresh`` (``torch.tensor``, ``as_tensor``, ``from_numpy``),
  ``_local_scalar_dense`` and the other data-dependent outputs (``.item()``,
  ``bool(t)``, ``float(t)``), dynamic output shapes (``nonzero``,
  ``masked_select``, ``unique``, boolean-mask indexing), random draws (any op
  tagged ``nondeterministic_seeded``: ``randn``, ``rand_like``, ``normal_``,
  ``bernoulli``, dropout in training), and cross-device copies.

The guard observes only: every operation runs as it would without it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from rollcap.kernels.errors import CaptureHazard

_TORCH_DIR = str(Path(torch.__file__).parent)
_HERE = __file__
_aten = torch.ops.aten

_HOST_DATA = {_aten.lift_fresh.default, _aten.lift_fresh_copy.default, _aten.lift.default}
_BOOL_INDEXED = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_HOST_READS = {
    torch.Tensor.numpy: ".numpy() (a host read of device data)",
    torch.Tensor.tolist: ".tolist() (a host read of device data)",
    torch.Tensor.cpu: ".cpu() (a copy to the host, a sync on a GPU)",
}
_FIX = {
    "host data": "build it once outside the captured function (a buffer: register_buffer(..., persistent=False)) or make it with a device factory (torch.full, torch.arange)",
    "host sync": "keep the value on the device (torch.where instead of a Python branch) or move the decision to the host, outside the graph",
    "shape": "use a fixed-shape form (torch.where, a multiplicative mask) instead of selecting by value",
    "random": "draw the noise on the host and pass it in through an input buffer",
}


def _user_frame() -> str:
    """``file:line in function: code`` of the innermost frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and not name.startswith(_TORCH_DIR) and not name.startswith("<") and "contextlib" not in name:
            break
        frame = frame.f_back
    if frame is None:
        return "an unknown line"
    import linecache

    path = Path(frame.f_code.co_filename)
    short = "/".join(path.parts[-2:])
    code = linecache.getline(str(path), frame.f_lineno).strip()
    return f"{short}:{frame.f_lineno} in {frame.f_code.co_name}" + (f": `{code}`" if code else "")


def _arg(func, args: tuple, kwargs: dict, name: str, default=None):
    """The value of the schema argument ``name`` of one ATen call."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else (a.default_value if a.has_default_value() else default)
    return default


def _random_draw(func, args: tuple, kwargs: dict) -> bool:
    """True for an op that draws random numbers here (dropout at p 0 or in eval, and SDPA without dropout, do not)."""
    if torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    name = func.name()
    if "scaled_dot_product" in name:
        return float(_arg(func, args, kwargs, "dropout_p", 0.0) or 0.0) > 0.0
    if "dropout" in name:
        return bool(_arg(func, args, kwargs, "train", True)) and float(_arg(func, args, kwargs, "p", 0.0) or 0.0) > 0.0
    return True


def _bool_index(args: tuple, kwargs: dict) -> bool:
    indices = kwargs.get("indices", args[1] if len(args) > 1 else ())
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


def _device_of(x) -> torch.device | None:
    return x.device if isinstance(x, torch.Tensor) else None


class _Guard:
    """Shared state of the two modes: the label and the first hazard's message."""

    def __init__(self, label: str):
        self.label = label

    def refuse(self, what: str, kind: str) -> None:
        raise CaptureHazard(f"{self.label}: cannot capture: {what} at {_user_frame()}; {_FIX[kind]}")


class _FunctionGuard(TorchFunctionMode):
    def __init__(self, guard: _Guard):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            self.guard.refuse(_HOST_READS[func], "host sync")
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
            device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            if device is not None and device.type == "cpu":
                self.guard.refuse(".to('cpu') (a copy to the host, a sync on a GPU)", "host sync")
        return func(*args, **kwargs)


class _DispatchGuard(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a dispatch mode's __torch_dispatch__ in torch._disable_dynamo unless this says no, and that
        # wrapper imports torch._dynamo on its first call: a second of start-up in every process that captures. The
        # guard runs only around eager warm-up calls, where torch.compile does not trace (dynamo runs a frame eagerly
        # while a dispatch mode is active), so there is nothing for the wrapper to keep out.
        return False

    def __init__(self, guard: _Guard):
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = f"aten.{func.name().split('::')[-1]}"
        if func in _HOST_DATA:
            self.guard.refuse(
                f"{name} (a tensor made from host data: torch.tensor / as_tensor / from_numpy)", "host data"
            )
        if torch.Tag.data_dependent_output in func.tags:
            self.guard.refuse(
                f"{name} (a tensor value read on the host: .item(), bool(t), float(t), int(t))", "host sync"
            )
        if func in _BOOL_INDEXED:
            if _bool_index(args, kwargs):
                self.guard.refuse(f"{name} with a boolean mask (its shape depends on the data)", "shape")
        elif torch.Tag.dynamic_output_shape in func.tags:
            self.guard.refuse(f"{name} (its output shape depends on the data)", "shape")
        if _random_draw(func, args, kwargs):
            self.guard.refuse(f"{name} (a random draw inside the graph)", "random")
        if func in (_aten.copy_.default, _aten._to_copy.default):
            src = _device_of(args[1] if func is _aten.copy_.default else args[0])
            dst = _device_of(args[0]) if func is _aten.copy_.default else kwargs.get("device")
            if src is not None and dst is not None and torch.device(dst).type != src.type:
                self.guard.refuse(
                    f"{name} from {src.type} to {torch.device(dst).type} (a copy across host and device)", "host data"
                )
        return func(*args, **kwargs)


@contextlib.contextmanager
def guarded(label: str = "graph") -> Iterator[None]:
    """Run the block with the capture guard on: the first hazard raises :class:`CaptureHazard`.

    Not re-entrant across threads: the modes are per thread, so call the guarded function in the thread
    that entered the block.
    """
    guard = _Guard(label)
    with _FunctionGuard(guard), _DispatchGuard(guard):
        yield


def check_capturable(fn: Callable, *args, label: str = "graph", **kwargs):
    """Call ``fn(*args, **kwargs)`` once under the guard and return its result (raises :class:`CaptureHazard`)."""
    with torch.no_grad(), guarded(label):
        return fn(*args, **kwargs)
