"""Fused hot-path ops, each with a torch reference.

``cfg_euler_step``: one Euler step of a flow sampler with classifier-free
guidance, ``x <- x + dt * (v_u + beta * (v_c - v_u))``. The torch reference is
used everywhere (and inside captured CPU plans); on CUDA, when ``triton``
imports, a single fused Triton kernel does the same arithmetic in the same
order (fp32), checked by a parity test.

``add_layernorm``: a pre-norm transformer's residual add fused into the next
layer norm (no affine: the lean sampler folds it into the next linear). One
pass reads the fp32 residual stream and the pending update (the last GEMM's
output, bf16 at bf16), writes the new residual (fp32) and the normalised
activation directly in the dtype the next GEMM reads: an add, a norm and a cast
kernel become one. On CUDA with ``triton`` a Triton kernel (one program per
row, fp32 statistics); else the torch reference (the unfused ops, so on CPU it
is the unfused module's arithmetic exactly). Tested on CPU against the
reference with Triton's interpreter (``TRITON_INTERPRET=1``).

``linear_gelu``: ``gelu_tanh(x @ W.T + b)``. On CUDA one cuBLASLt GEMM with a
bias+GELU(tanh) epilogue (``torch._addmm_activation``: no separate GELU pass
over the hidden activation); elsewhere the reference ``F.gelu(F.linear(...),
approximate="tanh")``. (Not the epilogue op on CPU: there ``_addmm_activation``
applies the exact erf GELU, not the model's tanh one.)

``quantize_rows_fp8``: each row of an activation scaled to float8 e4m3 by its own
absolute maximum (``scale = max(amax, 1e-12) / 448``, ``q = x / scale`` rounded to
nearest even): the operand ``torch._scaled_mm`` takes with row-wise scales (the
``fp8`` precision, :mod:`rollcap.kernels.fp8`). ``add_layernorm(...,
out_dtype=torch.float8_e4m3fn)`` does the same to the normalised rows inside the
fused norm kernel and returns ``(q, scale)`` as its second value.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn

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

    @triton.jit
    def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        scale = tl.div_rn(tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12), 448.0)
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * n_cols + cols, tl.div_rn(x, scale).to(q_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _gelu_quant_rows_kernel(x_ptr, q_ptr, s_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        g = 0.5 * x * (1.0 + (2.0 * tl.sigmoid(2.0 * u) - 1.0))  # tanh(u) = 2 sigmoid(2u) - 1
        g = tl.where(m, g, 0.0)
        scale = tl.div_rn(tl.maximum(tl.max(tl.abs(g), axis=0), 1e-12), 448.0)
        tl.store(s_ptr + row, scale)
        tl.store(q_ptr + row * n_cols + cols, tl.div_rn(g, scale).to(q_ptr.dtype.element_ty), mask=m)

    def _rows_to_fp8(kernel, x):
        """Launch a row-wise float8 kernel (one program a row): ``(q, scale)`` as the references return them."""
        x = x.contiguous()
        w = x.shape[-1]
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        block = max(16, triton.next_power_of_2(w))
        kernel[(x.numel() // w,)](x, q, scale, w, BLOCK=block, num_warps=4 if block <= 2048 else 8)
        return q, scale

    def _gelu_quant_rows_triton(x):
        return _rows_to_fp8(_gelu_quant_rows_kernel, x)

    def _quant_rows_triton(x):
        return _rows_to_fp8(_quant_rows_kernel, x)

    @triton.jit
    def _add_ln_kernel(
        x_ptr, d_ptr, xo_ptr, y_ptr, s_ptr, n_cols, eps, HAS_D: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_D:
            x = x + tl.load(d_ptr + row * n_cols + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(xo_ptr + row * n_cols + cols, x, mask=m)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / n_cols
        y = xc * (1.0 / tl.sqrt(var + eps))
        if QUANT:  # the normalised row to float8 by its own absolute maximum (quantize_rows_fp8's arithmetic)
            scale = tl.div_rn(tl.maximum(tl.max(tl.where(m, tl.abs(y), 0.0), axis=0), 1e-12), 448.0)
            tl.store(s_ptr + row, scale)
            y = tl.div_rn(y, scale)
        tl.store(y_ptr + row * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=m)

    def _add_ln_triton(x, d, eps, out_dtype):
        x = x.contiguous()
        w = x.shape[-1]
        rows = x.numel() // w
        y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
        quant = out_dtype == torch.float8_e4m3fn
        scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if quant else y
        if d is None:
            xo, dd = x, x
        else:
            dd = d.contiguous()
            xo = torch.empty_like(x)
        block = max(16, triton.next_power_of_2(w))
        _add_ln_kernel[(rows,)](
            x,
            dd,
            xo,
            y,
            scale,
            w,
            float(eps),
            HAS_D=d is not None,
            QUANT=quant,
            BLOCK=block,
            num_warps=4 if block <= 2048 else 8,
        )
        return xo, ((y, scale) if quant else y)


def quantize_rows_fp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``(q, scale)``, ``scale = max(amax(|row|), 1e-12) / 448`` (fp32, ``[..., 1]``), ``q = row / scale`` in e4m3."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    # A tensor divisor, not the Python scalar: CUDA's div by a host scalar multiplies by its reciprocal (one ulp off
    # an IEEE division for some rows; seen on an H100), and the kernels divide exactly (tl.div_rn).
    scale = amax / torch.full_like(amax, 448.0)
    return (x / scale).to(torch.float8_e4m3fn), scale


def quantize_rows_fp8(x: torch.Tensor, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise float8 (e4m3) quantisation of ``x`` (see the module docstring): the Triton kernel on CUDA, else the reference."""
    if fused and _HAVE_TRITON and x.is_cuda and x.shape[-1] <= 65536 and not torch.compiler.is_compiling():
        return _quant_rows_triton(x)
    return quantize_rows_fp8_reference(x)


def gelu_quantize_rows_fp8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: :func:`quantize_rows_fp8_reference` of ``gelu_tanh(x)`` computed in fp32."""
    return quantize_rows_fp8_reference(F.gelu(x.float(), approximate="tanh"))


def gelu_quantize_rows_fp8(x: torch.Tensor, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU (tanh) and row-wise float8 quantisation in one pass (the fp8 MLP between its two GEMMs); Triton on CUDA."""
    if fused and _HAVE_TRITON and x.is_cuda and x.shape[-1] <= 65536 and not torch.compiler.is_compiling():
        return _gelu_quant_rows_triton(x)
    return gelu_quantize_rows_fp8_reference(x)


def add_layernorm_reference(x: torch.Tensor, d: torch.Tensor | None, eps: float, out_dtype: torch.dtype):
    """Reference: ``x' = x + d`` (``x`` itself when ``d`` is None), ``y = layer_norm(x')`` (no affine) in ``out_dtype``
    (float8 e4m3: ``y`` is ``quantize_rows_fp8`` of the fp32 norm, a ``(q, scale)`` pair)."""
    if d is not None:
        x = x + d
    y = F.layer_norm(x, (x.shape[-1],), eps=eps)
    return x, (quantize_rows_fp8_reference(y) if out_dtype == torch.float8_e4m3fn else y.to(out_dtype))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a GEMM reading ``x`` runs in: autocast's where it is on for ``x``'s device, else ``x``'s own."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def add_layernorm(
    x: torch.Tensor, d: torch.Tensor | None, eps: float, out_dtype: torch.dtype | None = None, fused: bool = True
):
    """The residual add fused into the next (affine-free) layer norm: ``(x + d, layer_norm(x + d))``.

    ``x``: the fp32 residual stream ``[..., w]``; ``d``: the pending update (any float dtype; None: none);
    ``out_dtype``: the normalised output's dtype (default :func:`compute_dtype`; ``torch.float8_e4m3fn``: a row-wise
    quantised ``(q, scale)`` pair, as :func:`quantize_rows_fp8` makes of the fp32 norm). The Triton kernel on CUDA when
    available (not while ``torch.compile`` traces: inductor fuses the reference itself), else the reference.
    """
    out_dtype = out_dtype or compute_dtype(x)
    if (
        fused
        and _HAVE_TRITON
        and x.is_cuda
        and x.dtype == torch.float32
        and x.shape[-1] <= 65536
        and not torch.compiler.is_compiling()
    ):
        return _add_ln_triton(x, d, eps, out_dtype)
    return add_layernorm_reference(x, d, eps, out_dtype)


def linear_gelu_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Reference: ``gelu_tanh(linear(x, weight, bias))``."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """``gelu_tanh(x @ weight.T + bias)``: one cuBLASLt GEMM with a bias+GELU epilogue on CUDA (see the module docstring).

    The epilogue path takes ``x`` in the weight's dtype (the lean sampler stores weights in the compute dtype, and
    its norms write that dtype), so no cast runs; any other case is the reference.
    """
    if (
        fused
        and x.is_cuda
        and x.dtype == weight.dtype == bias.dtype
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and not torch.compiler.is_compiling()
    ):
        out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
        return out.view(*x.shape[:-1], weight.shape[0])
    return linear_gelu_reference(x, weight, bias)


def kernel_facts(device: torch.device | str) -> dict:
    """What the fused ops' bits depend on, on ``device`` (for a fingerprint): Triton's version where its kernels run."""
    if torch.device(device).type == "cuda":
        return {"fused_ops": f"triton {triton.__version__}" if _HAVE_TRITON else "torch", "gemm_epilogue": "cublaslt"}
    return {"fused_ops": "torch"}


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
