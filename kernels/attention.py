"""The action expert's attention: its few query tokens over the prefix's cached keys/values and their own.

At every Euler step each expert block attends ``H`` action tokens (both guidance branches: batch 2 at batch 1) to
the prefix's keys/values of that layer (computed once a chunk) followed by the tokens' own. The lean sampler's
reference path (:func:`expert_attention_reference`) copies the tokens' new keys/values into the last ``H`` rows of
the layer's key/value buffer, then calls SDPA over the whole buffer with the additive key mask: at ``3b`` that is
180 copy kernels and 180 attention calls a chunk, each call a few dozen thread blocks for 100 query rows (the last
H100 profile: about 17 µs each, 3.4 ms of the 19.4 ms of kernel time in a 20.7 ms chunk).

:func:`expert_attention` on CUDA with ``triton`` is one kernel a call instead (``_expert_attn_kernel``):

- the queries and the new keys/values are read straight from the ``qkv`` GEMM's output, the prefix's from the
  buffer: nothing is copied, and the buffer's last ``H`` rows are not written;
- one program per (batch row, head, block of :data:`BLOCK_M` queries): a guided ``3b`` step (2 batch rows, 16 heads,
  50 queries in 4 blocks) is 128 programs, where SDPA tiles 128 queries at a time; each walks the keys in blocks of
  :data:`BLOCK_N` with an online softmax in fp32 (scores, running max and sum, accumulator), in a fixed order: a
  call's bits do not depend on timing, so a CUDA graph of it equals its eager call;
- the output is written directly in the ``[B, H, width]`` layout the output projection reads.

The arithmetic is SDPA's (scale ``1/sqrt(head_dim)``, the additive mask added to the scaled scores, softmax), not
its rounding: the probabilities are rounded to the value dtype before the second product, as flash attention does.
So a chunk with the kernel equals its own eager chunk, not the reference path's; the bound is stated by the bench
(``kernel_sweep``'s ``max_abs_diff_vs_today``) and tested on CPU through Triton's interpreter. Where the kernel
cannot run (CPU, no ``triton``, a per-query mask, a layout it does not read) the reference runs.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from rollcap.kernels.ops import _HAVE_TRITON

if _HAVE_TRITON:  # pragma: no cover - CPU CI has no triton
    import triton
    import triton.language as tl

BLOCK_M = 16
"""Queries per program (``tl.dot``'s smallest tile: a batch row's 50 queries are 4 blocks, 64 rows computed)."""
BLOCK_N = 64
"""Keys per iteration of a program's walk over the keys."""

KERNEL_DEVICES = ("cuda",)
"""Device types the kernel is dispatched on (the interpreter test adds ``cpu``: Triton's interpreter runs it there)."""

KERNEL = "triton expert attention v1"
"""What a fingerprint says of the kernel (its arithmetic and tiling; a change of either changes this)."""


def _split(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused ``qkv`` projection ``[B, N, 3w]`` as queries ``[B, heads, N, head_dim]`` and keys/values
    ``[B, N, 2, heads, head_dim]`` (views)."""
    b, n, w3 = qkv.shape
    d = w3 // 3 // heads
    return qkv[..., : w3 // 3].view(b, n, heads, d).transpose(1, 2), qkv[..., w3 // 3 :].view(b, n, 2, heads, d)


def _sdpa(q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SDPA of ``q`` ``[B, heads, N, d]`` over ``kv`` ``[B, L, 2, heads, d]``, as ``[B, N, heads * d]``."""
    o = F.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2), attn_mask=mask)
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


def attend(qkv: torch.Tensor, heads: int, mask: torch.Tensor, kv_buf=None, kernel: bool = False) -> torch.Tensor:
    """A fused/lean block's attention from its ``qkv`` projection, ``[B, N, w]``: over its own keys (``kv_buf``
    None: the encoder), or over the cached prefix's and its own (:func:`expert_attention`; ``kernel`` as its
    ``fused``)."""
    if kv_buf is not None:
        return expert_attention(qkv, kv_buf, mask, heads, fused=kernel)
    return _sdpa(*_split(qkv, heads), mask)


def expert_attention_reference(qkv: torch.Tensor, kv_buf: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """Reference: the tokens' keys/values into ``kv_buf``'s last rows (in place), SDPA over the buffer, ``[B, H, w]``.

    ``qkv`` ``[B, H, 3w]`` (queries, then keys/values as ``[2, heads, head_dim]``); ``kv_buf`` ``[B, N + H, 2, heads,
    head_dim]``; ``mask`` additive ``[B, 1, 1, N + H]`` (or per query, ``[B, 1, H, N + H]``).
    """
    q, kv = _split(qkv, heads)
    kv_buf[:, kv_buf.shape[1] - qkv.shape[1] :].copy_(kv)
    return _sdpa(q, kv_buf, mask)


if _HAVE_TRITON:  # pragma: no cover - exercised by the cuda-marked tests and the interpreter test

    @triton.jit
    def _to(t, dtype: tl.constexpr, WIDEN: tl.constexpr):
        """``t`` rounded to ``dtype``, to nearest even. Under the interpreter (``WIDEN``), whose casts to bf16
        truncate (triton 3.9), the rounding is done on the bits and the value stays fp32 (exact: every product
        widens its operands there anyway)."""
        if WIDEN:
            if dtype == tl.bfloat16:
                u = t.to(tl.float32).to(tl.uint32, bitcast=True)
                u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
                return u.to(tl.float32, bitcast=True)
            return t.to(tl.float32)
        return t.to(dtype)

    @triton.jit
    def _attend(q, k, v, bias, m_i, l_i, acc, scale, PT: tl.constexpr, WIDEN: tl.constexpr, PREC: tl.constexpr):  # noqa: PLR0913 - a Triton helper: the running softmax's state and the kernel's constexprs
        """One block of keys into the running softmax of a block of queries (fp32 state); the probabilities are
        rounded to ``PT`` (the values' dtype) before the second product."""
        if WIDEN:  # the interpreter's dot: fp32 operands (exact widenings; see _widen)
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale + bias[None, :]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no valid key yet: nothing to rescale
        p = tl.exp(s - m_use[:, None])
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(_to(p, PT, WIDEN), v, input_precision=PREC)
        return m_new, l_i, acc

    @triton.jit
    def _expert_attn_kernel(  # noqa: PLR0913 - a Triton kernel: its pointers, strides and constexprs
        qkv_ptr,
        kv_ptr,
        mask_ptr,
        o_ptr,
        n,
        n_prefix,
        heads,
        s_qkv_b,
        s_qkv_n,
        s_kv_b,
        s_kv_n,
        s_m_b,
        s_o_b,
        s_o_n,
        scale,
        W: tl.constexpr,
        D: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        WIDEN: tl.constexpr,
        PREC: tl.constexpr,
    ):
        VT: tl.constexpr = kv_ptr.dtype.element_ty
        bh = tl.program_id(0)
        b = (bh // heads).to(tl.int64)
        hd = (bh % heads) * D
        rows = tl.program_id(1) * BM + tl.arange(0, BM)
        rmask = rows < n
        dd = tl.arange(0, D)
        qkv_b = qkv_ptr + b * s_qkv_b
        q = tl.load(qkv_b + rows[:, None] * s_qkv_n + hd + dd[None, :], mask=rmask[:, None], other=0.0)
        if WIDEN:
            q = q.to(tl.float32)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        kv_b, mask_b = kv_ptr + b * s_kv_b, mask_ptr + b * s_m_b
        for start in range(0, n_prefix, BN):  # the prefix's keys/values, from the buffer
            keys = start + tl.arange(0, BN)
            kmask = keys < n_prefix
            at = kv_b + keys[:, None] * s_kv_n + hd + dd[None, :]
            k = tl.load(at, mask=kmask[:, None], other=0.0)
            v = tl.load(at + W, mask=kmask[:, None], other=0.0)
            bias = tl.load(mask_b + keys, mask=kmask, other=float("-inf")).to(tl.float32)
            m_i, l_i, acc = _attend(q, k, v, bias, m_i, l_i, acc, scale, VT, WIDEN, PREC)
        for start in range(0, n, BN):  # the tokens' own, straight from the qkv GEMM's output
            keys = start + tl.arange(0, BN)
            kmask = keys < n
            at = qkv_b + keys[:, None] * s_qkv_n + W + hd + dd[None, :]
            k = tl.load(at, mask=kmask[:, None], other=0.0)
            v = tl.load(at + W, mask=kmask[:, None], other=0.0)
            bias = tl.load(mask_b + n_prefix + keys, mask=kmask, other=float("-inf")).to(tl.float32)
            m_i, l_i, acc = _attend(q, k, v, bias, m_i, l_i, acc, scale, VT, WIDEN, PREC)
        o = acc / l_i[:, None]
        at = o_ptr + b * s_o_b + rows[:, None] * s_o_n + hd + dd[None, :]
        tl.store(at, _to(o, o_ptr.dtype.element_ty, WIDEN).to(o_ptr.dtype.element_ty), mask=rmask[:, None])

    def _expert_attention_triton(qkv: torch.Tensor, kv_buf: torch.Tensor, mask: torch.Tensor, heads: int):
        b, n, w3 = qkv.shape
        w = w3 // 3
        d = w // heads
        out = torch.empty((b, n, w), dtype=qkv.dtype, device=qkv.device)
        grid = (b * heads, triton.cdiv(n, BLOCK_M))
        _expert_attn_kernel[grid](
            qkv,
            kv_buf,
            mask,
            out,
            n,
            kv_buf.shape[1] - n,
            heads,
            qkv.stride(0),
            qkv.stride(1),
            kv_buf.stride(0),
            kv_buf.stride(1),
            mask.stride(0) if mask.shape[0] > 1 else 0,
            out.stride(0),
            out.stride(1),
            1.0 / math.sqrt(d),
            W=w,
            D=d,
            BM=BLOCK_M,
            BN=BLOCK_N,
            WIDEN=_widen(),
            PREC="ieee"
            if qkv.dtype == torch.float32
            else "tf32",  # fp32: no TF32 rounding; bf16: tensor cores either way
            num_warps=4,
        )
        return out


def _widen() -> bool:
    """Whether the kernel widens its operands to fp32 before each product: under Triton's interpreter only, whose
    ``tl.dot`` multiplies bf16 tensors as their bit patterns (triton 3.9, CPU), and whose casts to bf16 truncate
    (so the kernel rounds there on the bits: ``_to``). The widening is exact, so there the kernel's arithmetic is the
    GPU's up to the order of each product's sums (fp32 accumulation in both)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_fits(qkv: torch.Tensor, kv_buf: torch.Tensor, mask: torch.Tensor, heads: int) -> str | None:
    """Why the kernel cannot take these operands (None: it can): the layouts and shapes it reads."""
    b, n, w3 = qkv.shape
    w = w3 // 3
    d = w // heads if heads else 0
    if w3 != 3 * w or heads * d != w or d < 16 or d & (d - 1):
        return f"head_dim {d}: the kernel takes a power of two >= 16"
    if qkv.stride(-1) != 1:
        return "qkv: rows not contiguous"
    if kv_buf.dim() != 5 or kv_buf.shape[0] != b or kv_buf.shape[1] < n or kv_buf.shape[2:] != (2, heads, d):
        return f"kv_buf: shape {tuple(kv_buf.shape)}, expected [{b}, N + {n}, 2, {heads}, {d}]"
    if kv_buf.stride()[2:] != (heads * d, d, 1) or kv_buf.dtype != qkv.dtype:
        return "kv_buf: not [2, heads, head_dim]-contiguous in qkv's dtype"
    if mask.dim() != 4 or mask.shape[1:3] != (1, 1) or mask.shape[-1] != kv_buf.shape[1] or mask.stride(-1) != 1:
        return f"mask: {tuple(mask.shape)}; the kernel reads one additive key row per batch row"
    if mask.shape[0] not in (1, b):
        return f"mask: batch {mask.shape[0]}, qkv's {b}"
    return None


def expert_attention(
    qkv: torch.Tensor, kv_buf: torch.Tensor, mask: torch.Tensor, heads: int, fused: bool = True
) -> torch.Tensor:
    """The expert's attention output ``[B, H, w]`` (see the module docstring): the Triton kernel when ``fused``, on
    CUDA with ``triton``, and the operands fit it (:func:`kernel_fits`); else :func:`expert_attention_reference`."""
    if (
        fused
        and _HAVE_TRITON
        and qkv.device.type in KERNEL_DEVICES
        and not torch.compiler.is_compiling()
        and kernel_fits(qkv, kv_buf, mask, heads) is None
    ):
        return _expert_attention_triton(qkv, kv_buf, mask, heads)
    return expert_attention_reference(qkv, kv_buf, mask, heads)


def attention_facts(fused: bool, device: torch.device | str) -> dict:
    """What a chunk's bits depend on of the expert's attention on ``device`` (for a fingerprint; empty: the reference)."""
    if fused and _HAVE_TRITON and torch.device(device).type in KERNEL_DEVICES:
        return {"expert_attention": f"{KERNEL} (BLOCK_M {BLOCK_M}, BLOCK_N {BLOCK_N}; triton {triton.__version__})"}
    return {}
