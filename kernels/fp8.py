"""The ``fp8`` precision's linear: float8 (e4m3) weights with per-output-channel scales, ``torch._scaled_mm``.

:func:`to_fp8` replaces the ``nn.Linear`` modules under a model's ``FP8_SCOPE`` (the FlowVLA samplers name
``expert.blocks``: the action expert's per-step GEMMs, small-M and memory-bound, whose weights a chunk reads ``K``
times) with :class:`Fp8Linear`. The rest of the model runs at bf16 (the ``fp8`` precision context is bf16 autocast).

- weight ``W [N, K]``: ``scale_w[n] = max(amax(|W[n]|), 1e-12) / 448`` (fp32), ``W8 = W / scale_w`` rounded to e4m3,
  once, at load;
- activation ``x [M, K]``: per row, at every call, the same way (:func:`~rollcap.kernels.ops.quantize_rows_fp8`; the
  lean sampler's fused norm writes it directly);
- ``y = _scaled_mm(x8, W8.T, scale_x [M, 1], scale_w [1, N], bias, out_dtype=bf16)``: row-wise scaled GEMM, fp32
  accumulate, bf16 out (cuBLASLt/CUTLASS on sm89+). The bias rides in the call where this torch takes it there
  (probed once at build, :func:`bias_in_scaled_mm`), else one add after it.

Deterministic: no atomics, fixed shapes, so a captured graph equals its own eager reference byte for byte and two
processes agree. Hardware: float8 tensor cores need compute capability 8.9 (Ada) or newer; ``check_precision``
refuses ``fp8`` elsewhere (any CPU) in one line. (``torch._scaled_mm`` also runs on CPU, which is how the CPU tests
check this module against its reference; a CPU run at ``fp8`` is still refused: it would be slower and nobody
deploys it.)
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.kernels.ops import quantize_rows_fp8

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
RECIPE = "e4m3 weights per output channel, activations per row (dynamic), _scaled_mm row-wise, bf16 out"
"""The fp8 recipe, as the fingerprint names it."""
MIN_CAPABILITY = (8, 9)


def fp8_supported(device: torch.device | str) -> bool:
    """Whether ``device`` has float8 tensor cores (CUDA, compute capability 8.9 or newer)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


@cache
def bias_in_scaled_mm(device_type: str) -> bool:
    """Whether this torch's row-wise ``_scaled_mm`` takes a bf16 bias on ``device_type`` (probed once on tiny operands)."""
    dev = torch.device(device_type)
    a = torch.ones(16, 16, device=dev).to(FP8)
    try:
        out = torch._scaled_mm(
            a,
            a.t(),
            scale_a=torch.ones(16, 1, device=dev),
            scale_b=torch.ones(1, 16, device=dev),
            bias=torch.ones(16, device=dev, dtype=torch.bfloat16),
            out_dtype=torch.bfloat16,
        )
        return bool(out[0, 0].item() == 17.0)
    except (RuntimeError, TypeError, ValueError):
        return False


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W8 [N, K] e4m3, scale [1, N] fp32)`` of a weight ``[N, K]`` (per output channel)."""
    w = w.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (w / scale).to(FP8), scale.t().contiguous()


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` at fp8 (see the module docstring). Called with a tensor, or with a ``(q, scale)`` pair already
    quantised per row (the lean sampler's fused norm)."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        q, scale = quantize_weight(lin.weight)
        self.register_buffer("weight_fp8", q)
        self.register_buffer("weight_scale", scale)
        bias = lin.bias.detach().to(torch.bfloat16) if lin.bias is not None else None
        self.register_buffer("bias", bias)
        self._bias_in_call = bias is not None and bias_in_scaled_mm(q.device.type)

    def forward(self, x, gelu: bool = False) -> torch.Tensor:
        q, scale = x if isinstance(x, tuple) else quantize_rows_fp8(x)
        lead = q.shape[:-1]
        # Outside autocast: CPU autocast rewrites _scaled_mm's operands (measured: other bits), and the operands'
        # dtypes here are the recipe's, not autocast's to choose.
        with torch.autocast(q.device.type, enabled=False):
            out = torch._scaled_mm(
                q.reshape(-1, self.in_features),
                self.weight_fp8.t(),
                scale_a=scale.reshape(-1, 1),
                scale_b=self.weight_scale,
                bias=self.bias if self._bias_in_call else None,
                out_dtype=torch.bfloat16,
            )
        if self.bias is not None and not self._bias_in_call:
            out = out + self.bias
        if gelu:
            out = F.gelu(out, approximate="tanh")
        return out.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3"


def convertible(lin: nn.Module) -> bool:
    """An ``nn.Linear`` ``_scaled_mm`` takes: both features multiples of 16."""
    return isinstance(lin, nn.Linear) and lin.in_features % 16 == 0 and lin.out_features % 16 == 0


def to_fp8(model: nn.Module, scope: tuple[str, ...] | None = None) -> nn.Module:
    """``model`` with the convertible linears under each path in its class's ``FP8_SCOPE`` (or ``scope``) replaced by
    :class:`Fp8Linear` (in place; returns it). A model without ``FP8_SCOPE`` is returned as it is (it runs at bf16).
    ``scope`` is for measurements (the bench's prefix-too setting); the ``fp8`` precision uses ``FP8_SCOPE``."""
    for path in getattr(type(model), "FP8_SCOPE", ()) if scope is None else scope:
        scope = model.get_submodule(path)
        for parent in list(scope.modules()):
            for name, child in list(parent.named_children()):
                if convertible(child):
                    setattr(parent, name, Fp8Linear(child))
    return model


def fp8_facts(model: nn.Module) -> dict:
    """The fingerprint's fp8 facts: the recipe, how many linears run at fp8, and where the bias goes."""
    lins = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    in_call = any(m._bias_in_call for m in lins)
    return {"fp8": RECIPE, "fp8_linears": len(lins), "fp8_bias": "in _scaled_mm" if in_call else "added after"}
