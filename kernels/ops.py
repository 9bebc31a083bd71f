"""Fused hot-path ops, each with a torch reference.

``cfg_euler_step``: one Euler step of a flow sampler with classifier-free
guidance, ``x <- x + dt * (v_u + beta * (v_c - v_u))``. The torch reference is
used everywhere (and inside captured CPU plans); on CUDA, when ``triton``
imports, a single fused Triton kernel does the same arithmetic in the same
order (fp32), checked by a parity test.
"""

from __future__ import annotations

import torch

try:  # optional: only on CUDA machines with triton
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - CPU CI has no triton
    _HAVE_TRITON = False


def cfg_euler_step_reference(
    x: torch.Tensor, v_u: torch.Tensor, v_c: torch.Tensor, dt: float, beta: float
) -> torch.Tensor:
    """Reference: ``x + dt * (v_u + beta * (v_c - v_u))`` (new tensor)."""
    return x + dt * (v_u + beta * (v_c - v_u))


if _HAVE_TRITON:  # pragma: no cover - exercised by the cuda-marked tests

    @triton.jit
    def _cfg_euler_kernel(x_ptr, vu_ptr, vc_ptr, out_ptr, n, dt, beta, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        vu = tl.load(vu_ptr + offs, mask=m)
        vc = tl.load(vc_ptr + offs, mask=m)
        tl.store(out_ptr + offs, x + dt * (vu + beta * (vc - vu)), mask=m)

    def _cfg_euler_triton(x, v_u, v_c, dt, beta):
        x, v_u, v_c = x.contiguous(), v_u.contiguous(), v_c.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        block = 1024
        _cfg_euler_kernel[(triton.cdiv(n, block),)](x, v_u, v_c, out, n, float(dt), float(beta), BLOCK=block)
        return out


def triton_available() -> bool:
    return _HAVE_TRITON and torch.cuda.is_available()


def cfg_euler_step(
    x: torch.Tensor, v_u: torch.Tensor, v_c: torch.Tensor, dt: float, beta: float, fused: bool = True
) -> torch.Tensor:
    """One guided Euler step; the Triton kernel on CUDA fp32 when available, else the reference.

    While ``torch.compile`` traces it (a compiled region of the ``compile-cuda`` backend) it is the reference:
    inductor fuses that arithmetic into its neighbours' kernels, which an opaque Triton call would prevent.
    """
    if fused and _HAVE_TRITON and x.is_cuda and x.dtype == torch.float32 and not torch.compiler.is_compiling():
        return _cfg_euler_triton(x, v_u, v_c, dt, beta)
    return cfg_euler_step_reference(x, v_u, v_c, dt, beta)
