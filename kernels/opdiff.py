"""Which op's bits differ: a digest of every ATen op's inputs and outputs along one call, and the first op to differ.

Two machines (or two settings of one) that disagree on a chunk agree on its inputs; somewhere in the forward one op
gets equal inputs and returns other bits. :func:`trace_ops` runs a function eagerly under a dispatch mode that digests
each op's tensor arguments and results; :func:`first_difference` walks two traces side by side and names the first op
whose inputs are equal and whose outputs are not: the op whose kernel depends on the machine (on an Intel and an AMD
box with the same ATen capability, the first ``aten::addmm``: MKL's GEMM).

Observes only: every op runs as it would without the trace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _digest(values) -> str:
    h = hashlib.sha256()
    for v in tree_flatten(values)[0]:
        if isinstance(v, torch.Tensor):
            t = v.detach().to("cpu").contiguous()
            h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


class _Trace(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[dict] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # as rollcap.kernels.guard's: an eager call, nothing for dynamo to trace
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _digest((args, kwargs))
        out = func(*args, **kwargs)
        self.ops.append({"op": str(func.overloadpacket.__name__), "inputs": inputs, "outputs": _digest(out)})
        return out


def trace_ops(fn: Callable, *args, **kwargs) -> list[dict]:
    """Run ``fn(*args, **kwargs)`` once under no_grad and return ``[{"op", "inputs", "outputs"}, ...]`` in call order."""
    trace = _Trace()
    with torch.no_grad(), trace:
        fn(*args, **kwargs)
    return trace.ops


def first_difference(a: list[dict], b: list[dict]) -> dict | None:
    """The first op of two traces of the same call whose inputs agree and outputs differ (None: none differs).

    Returns ``{"index", "op", "ops", "why"}`` (``ops``: the trace's length). Where no op gets equal inputs and gives
    other outputs but some op's inputs differ, the calls were given other values: that first op is named. Where the
    traces stop being the same sequence of ops, the first op that differs is named as ``"a=... b=..."``.
    """
    other_inputs = None
    for i, (x, y) in enumerate(zip(a, b)):
        if x["op"] != y["op"]:
            return {"index": i, "op": f"a={x['op']} b={y['op']}", "ops": len(a), "why": "the calls took other paths"}
        if x["inputs"] == y["inputs"] and x["outputs"] != y["outputs"]:
            return {"index": i, "op": x["op"], "ops": len(a), "why": "equal inputs, other outputs"}
        if other_inputs is None and x["inputs"] != y["inputs"]:
            other_inputs = {
                "index": i,
                "op": x["op"],
                "ops": len(a),
                "why": "other inputs: the calls were given other values",
            }
    if len(a) != len(b):
        return {"index": min(len(a), len(b)), "op": "end", "ops": len(a), "why": f"{len(a)} ops vs {len(b)}"}
    return other_inputs
