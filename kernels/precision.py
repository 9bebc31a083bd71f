"""Numeric precision as a deployment setting: ``fp32``, ``tf32``, ``bf16`` or ``fp8``.

A precision is a context a graph's function runs in, the same for its eager
reference, its warm-up and its capture, so a captured chunk equals its own
precision's eager chunk byte for byte:

- ``fp32``: no context (every figure and recording before this setting existed).
- ``tf32``: CUDA matmuls and convolutions on TF32 tensor cores (inputs rounded
  to a 10-bit mantissa, fp32 accumulate). A CUDA mode: refused on CPU.
- ``bf16``: ``torch.autocast`` to bfloat16 (matmuls, attention and the other
  autocast-listed ops in bf16; norms and reductions stay fp32), on CUDA or CPU.
  The weight-cast cache is off, so a replay never reads a cast made by
  another call. A ``jit`` plan traced under autocast holds the casts itself
  and replays without the context; a CUDA graph captured under it likewise.
- ``fp8``: ``bf16``, and the linears a model names in ``FP8_SCOPE`` (a FlowVLA's action-expert blocks) at float8
  e4m3 with per-output-channel weight scales through ``torch._scaled_mm`` (:mod:`rollcap.kernels.fp8`). Needs float8
  tensor cores (CUDA, compute capability 8.9 or newer): refused elsewhere, any CPU included.

The precision is part of a runner's fingerprint when it is not ``fp32``, so an
``fp32`` recording's fingerprint is what it was before the setting existed.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from rollcap.kernels.fp8 import fp8_supported

PRECISIONS = ("fp32", "tf32", "bf16", "fp8")
DEFAULT_PRECISION = "fp32"


def check_precision(precision: str, device: torch.device | str) -> str:
    """``precision`` if it can run on ``device``; else ValueError saying what can."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "tf32" and torch.device(device).type != "cuda":
        raise ValueError("tf32 is a CUDA tensor-core mode; on CPU use fp32 or bf16")
    if precision == "fp8" and not fp8_supported(device):
        dev = torch.device(device)
        where = (
            f"{torch.cuda.get_device_name(dev)} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability(dev)))})"
            if dev.type == "cuda" and torch.cuda.is_available()
            else str(dev)
        )
        raise ValueError(
            f"fp8 needs float8 tensor cores (a CUDA GPU of compute capability 8.9 or newer); {where} has none: use bf16"
        )
    return precision


@contextlib.contextmanager
def precision_context(precision: str, device: torch.device | str) -> Iterator[None]:
    """Run the block at ``precision`` on ``device``'s kind (see the module docstring)."""
    if precision == "fp32":
        yield
    elif precision in ("bf16", "fp8"):  # fp8: the model's fp8 linears are explicit; everything else runs bf16
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False):
            yield
    elif precision == "tf32":
        matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        before = (matmul.allow_tf32, cudnn.allow_tf32)
        matmul.allow_tf32 = cudnn.allow_tf32 = True
        try:
            yield
        finally:
            matmul.allow_tf32, cudnn.allow_tf32 = before
    else:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")


def cast_linears(module: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """A copy of ``module`` whose ``nn.Linear`` weights and biases are stored in ``dtype`` (nothing else changes).

    Under autocast a linear casts its fp32 weight to bf16 on every call (the cast cache is off, and inside a
    captured graph the cast kernels replay anyway): one extra kernel and a full read of the fp32 weight per
    linear per call. Storing the cast once gives the same bits (the same rounding, done once) with neither.
    Only linears, and the parameters a module names in ``CAST_PARAMS`` (matmul operands autocast casts alike, e.g.
    the lean sampler's batched prefix projection): other parameters (norms, embeddings, positions) go to ops
    autocast does not cast alike. The fp32 tensors are never copied (the copy is built around the cast ones).
    """
    memo: dict[int, torch.nn.Parameter] = {}
    for m in module.modules():
        params = [m.weight, m.bias] if isinstance(m, torch.nn.Linear) else []
        params += [getattr(m, name) for name in getattr(type(m), "CAST_PARAMS", ())]
        for p in params:
            if p is not None and p.dtype != dtype:
                memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
    return copy.deepcopy(module, memo)
