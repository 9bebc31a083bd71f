"""A small action expert's whole Euler step in one kernel: input projection, every block, output projection.

At the small sizes a guided chunk is launch-bound, not bandwidth- or compute-bound. The lean sampler's expert step
on CUDA is eight kernels a block (add + norm, ``qkv``, key/value copy, attention, output projection, add + norm, MLP
up with GELU, MLP down) plus the branch copy, the input projection and its bias, the output norm and projection and
the guided update: 30 kernels a step at ``shipped`` (3 blocks of width 128; counted from the ops the step
dispatches, not profiled), each a few microseconds of almost no work (the last H100 table: 1.05 ms a chunk). The
issue's goal there is 0.5 ms, which no faster GEMM reaches: the kernels have to go.

:func:`expert_step` on CUDA with ``triton`` is one kernel for the whole step (``_expert_step_kernel``), one program
per batch row (each guidance branch of each env row: 2 programs at batch 1, 64 at 32 batched envs). A program
holds its row's ``H`` action tokens (padded to :data:`BLOCK_M`) in registers through the whole step:

- the input projection of the noisy actions (one copy read by both branches' programs: the sampler's ``repeat``
  kernel goes too) plus the step's bias (time embedding and positions);
- each block: the affine-free norm (the lean sampler folds its affine into the next linear); per head, the
  queries, keys and values of the tokens, attention over the layer's cached prefix keys/values (from the buffer)
  and the tokens' own (from registers: nothing is written to the buffer), and that head's share of the output
  projection; the residual add; the second norm; the MLP in chunks of :data:`BLOCK_C` hidden units (up, bias,
  GELU(tanh), down), so the hidden activation never leaves the program; the residual add;
- the output norm and projection, written as the velocity ``[B, H, A]``.

Weights are read from stacked ``[depth, ...]`` copies made once per device and dtype (:func:`stack_blocks`), and
each activation is rounded to the weights' dtype where the lean sampler's GEMMs write it (the normalised rows, the
queries/keys/values, the attention output, each GEMM's output), so a bf16 step is the lean step's arithmetic up to
the order of each product's sums; the residual stream and every statistic stay fp32. The sums run in a fixed
order (no atomics, no split-K): a CUDA graph of it equals its eager call.

It is for small experts only (:func:`step_fits`: width at most :data:`MAX_WIDTH`): a program reads every expert
weight once a step, so at ``26m`` (38 MB of expert weights a step) one program per row would take longer than the
whole step takes now. Where it does not fit, on CPU, or without ``triton``, the lean sampler's own step runs
(:class:`~rollcap.policies.lean.LeanExpert`), byte for byte. Tested on CPU through Triton's interpreter
(``tests/kernels/test_expert_step.py``).
"""

from __future__ import annotations

import math

import torch

from rollcap.kernels.attention import _widen
from rollcap.kernels.ops import _HAVE_TRITON

if _HAVE_TRITON:  # pragma: no cover - CPU CI has no triton
    import triton
    import triton.language as tl

    from rollcap.kernels.attention import _attend, _to

BLOCK_M = 16
"""Action tokens per program (``tl.dot``'s smallest tile): the kernel takes a horizon of at most this."""
BLOCK_C = 64
"""Hidden units of the MLP per iteration (its up and down products, one chunk at a time)."""
BLOCK_N = 64
"""Prefix keys per iteration of the attention's walk."""
NUM_WARPS = 8
"""Warps per program: with 4, sm90's compiler needs all 255 registers a thread and spills at width 256 (bf16)."""
MAX_WIDTH = 256
"""The widest expert the kernel takes (see the module docstring)."""

KERNEL_DEVICES = ("cuda",)
"""Device types the kernel is dispatched on (the interpreter test adds ``cpu``)."""

KERNEL = "triton expert step v1"
"""What a fingerprint says of the kernel (its arithmetic and tiling; a change of either changes this)."""

_STACKED = ("qkv_w", "qkv_b", "out_w", "out_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b")


def stack_blocks(blocks) -> dict[str, torch.Tensor]:
    """The blocks' linears as ``[depth, ...]`` contiguous tensors (the kernel indexes layer ``l`` by its stride)."""
    out = {}
    for name in ("qkv", "out", "fc1", "fc2"):
        out[f"{name}_w"] = torch.stack([getattr(b, name).weight.detach() for b in blocks]).contiguous()
        out[f"{name}_b"] = torch.stack([getattr(b, name).bias.detach() for b in blocks]).contiguous()
    return out


def shape_fits(width: int, heads: int, mlp: int, horizon: int, action_dim: int) -> str | None:
    """Why the kernel cannot take an expert of this shape (None: it can)."""
    d = width // heads
    if width > MAX_WIDTH or width & (width - 1) or width < 16:
        return f"expert width {width}: the step kernel takes a power of two from 16 to {MAX_WIDTH}"
    if d < 16 or d & (d - 1) or d * heads != width:
        return f"head_dim {d}: the step kernel takes a power of two >= 16"
    if horizon > BLOCK_M or action_dim > BLOCK_M:
        return f"horizon {horizon}, {action_dim} action dims: the step kernel takes at most {BLOCK_M} of each"
    if mlp % BLOCK_C:
        return f"MLP width {mlp}: the step kernel takes a multiple of {BLOCK_C}"
    return None


def config_fits(cfg) -> str | None:
    """:func:`shape_fits` of a :class:`~rollcap.policies.flow_vla.FlowVLAConfig`'s expert (nothing is built)."""
    w = cfg.expert_width or cfg.width
    return shape_fits(w, cfg.heads, w * cfg.mlp_ratio, cfg.horizon, cfg.action_dim)


def expert_fits(expert) -> str | None:
    """Why the kernel cannot run the lean ``expert``'s steps at all (None: it can, for operands that fit): its shape
    and weights."""
    blocks = expert.blocks
    heads = blocks[0].heads
    dtype = blocks[0].qkv.weight.dtype
    why = shape_fits(
        expert.width, heads, blocks[0].fc1.weight.shape[0], expert.step_bias.shape[1], expert.in_w.shape[1]
    )
    if why is not None:
        return why
    if dtype not in (torch.float32, torch.bfloat16):
        return f"weights in {dtype}: the step kernel takes float32 or bfloat16"
    for blk in blocks:
        for lin in (blk.qkv, blk.out, blk.fc1, blk.fc2):
            if type(lin) is not torch.nn.Linear or lin.weight.dtype != dtype or lin.bias is None:
                return "a block linear that is not a plain nn.Linear in one dtype (fp8?)"
        if (blk.eps1, blk.eps2, blk.heads) != (blocks[0].eps1, blocks[0].eps2, heads):
            return "blocks with other norm eps or heads"
    if expert.in_w.dtype != dtype or expert.out.weight.dtype != dtype:
        return "input/output projections in another dtype than the blocks'"
    return None


def step_fits(expert, x: torch.Tensor, step_bias: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor) -> str | None:
    """Why the kernel cannot run this step of the lean ``expert`` (None: it can): :func:`expert_fits`, then the
    operands' sizes, dtypes and layouts."""
    why = expert_fits(expert)
    if why is not None:
        return why
    blocks = expert.blocks
    n, h, a = x.shape
    b = kv.shape[1]
    w = expert.width
    heads = blocks[0].heads
    d = w // heads
    dtype = blocks[0].qkv.weight.dtype
    if n == 0 or b % n:
        return f"x: {tuple(x.shape)}; its rows must divide the batch of kv ({b})"
    if (h, a) != (expert.step_bias.shape[1], expert.in_w.shape[1]):
        return f"x: {tuple(x.shape)}, the expert takes [B, {expert.step_bias.shape[1]}, {expert.in_w.shape[1]}]"
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        if torch.get_autocast_dtype(dev) != dtype:
            return f"autocast to {torch.get_autocast_dtype(dev)} over {dtype} weights"
    elif dtype != torch.float32:
        return f"{dtype} weights without autocast"
    if step_bias.shape[-2:] != (h, w) or step_bias.dim() not in (2, 3) or step_bias.stride()[-2:] != (w, 1):
        return f"step_bias: {tuple(step_bias.shape)}, expected [(B,) {h}, {w}] with contiguous rows"
    if step_bias.dim() == 3 and step_bias.shape[0] != b:
        return f"step_bias: batch {step_bias.shape[0]}, kv's {b}"
    want = (len(blocks), b, kv.shape[2], 2, heads, d)
    if kv.shape != want or kv.dtype != dtype or kv.stride()[3:] != (w, d, 1) or kv.shape[2] < h:
        return f"kv: {tuple(kv.shape)} {kv.dtype}, expected [depth, B, N + H, 2, heads, head_dim] in {dtype}"
    if mask.dim() != 4 or mask.shape[1:3] != (1, 1) or mask.shape[-1] != kv.shape[2] or mask.stride(-1) != 1:
        return f"mask: {tuple(mask.shape)}; the kernel reads one additive key row per batch row"
    if mask.shape[0] not in (1, b):
        return f"mask: batch {mask.shape[0]}, kv's {b}"
    return None


if _HAVE_TRITON:  # pragma: no cover - exercised by the cuda-marked tests and the interpreter test

    @triton.jit
    def _mm(a, b, WIDEN: tl.constexpr, PREC: tl.constexpr):
        """``a @ b`` in fp32 (the interpreter's dot: fp32 operands, see attention._widen)."""
        if WIDEN:
            a, b = a.to(tl.float32), b.to(tl.float32)
        return tl.dot(a, b, input_precision=PREC)

    @triton.jit
    def _norm(z, eps, W: tl.constexpr):
        """Affine-free layer norm of each row of ``z`` ``[BM, W]`` (fp32; add_layernorm's arithmetic)."""
        mean = tl.sum(z, axis=1) / W
        zc = z - mean[:, None]
        var = tl.sum(zc * zc, axis=1) / W
        return zc * (1.0 / tl.sqrt(var + eps))[:, None]

    @triton.jit
    def _round(t, WT: tl.constexpr, WIDEN: tl.constexpr):
        """``t`` rounded to the weights' dtype (where the lean sampler's GEMMs write it), back in fp32."""
        return _to(t, WT, WIDEN).to(tl.float32)

    @triton.jit
    def _expert_step_kernel(  # noqa: PLR0913 - a Triton kernel: its pointers, strides and constexprs
        x_ptr,
        x_rows,
        s_x_b,
        s_x_h,
        in_w_ptr,
        bias_ptr,
        s_bias_b,
        qkv_w,
        qkv_b,
        out_w,
        out_b,
        fc1_w,
        fc1_b,
        fc2_w,
        fc2_b,
        kv_ptr,
        s_kv_l,
        s_kv_b,
        s_kv_n,
        mask_ptr,
        s_m_b,
        ow_ptr,
        ob_ptr,
        v_ptr,
        s_v_b,
        s_v_h,
        h_len,
        n_prefix,
        eps1,
        eps2,
        eps_out,
        scale,
        L: tl.constexpr,
        W: tl.constexpr,
        A: tl.constexpr,
        HEADS: tl.constexpr,
        D: tl.constexpr,
        M: tl.constexpr,
        BM: tl.constexpr,
        BC: tl.constexpr,
        BN: tl.constexpr,
        WIDEN: tl.constexpr,
        PREC: tl.constexpr,
    ):
        WT: tl.constexpr = qkv_w.dtype.element_ty
        b = tl.program_id(0).to(tl.int64)
        rows = tl.arange(0, BM)
        rmask = rows < h_len
        cols = tl.arange(0, W)
        dd = tl.arange(0, D)
        aa = tl.arange(0, BM)  # action dims, padded to a dot's smallest tile
        amask = aa < A
        # the input projection (the actions in the weights' dtype, as autocast's linear reads them) plus the step's bias
        xa = tl.load(
            x_ptr + (b % x_rows) * s_x_b + rows[:, None] * s_x_h + aa[None, :],
            mask=rmask[:, None] & amask[None, :],
            other=0.0,
        )
        wi = tl.load(in_w_ptr + cols[None, :] * A + aa[:, None], mask=amask[:, None], other=0.0)  # [A, W]
        z = _round(_mm(_to(xa, WT, WIDEN), wi, WIDEN, PREC), WT, WIDEN)
        z += tl.load(bias_ptr + b * s_bias_b + rows[:, None] * W + cols[None, :], mask=rmask[:, None], other=0.0)
        # the tokens' own keys: valid for the first h_len, with the mask's own entries
        own_bias = tl.load(mask_ptr + b * s_m_b + n_prefix + rows, mask=rmask, other=float("-inf")).to(tl.float32)
        for layer in range(L):
            lw = layer * 3 * W * W
            y = _to(_norm(z, eps1, W), WT, WIDEN)
            o_acc = tl.zeros([BM, W], tl.float32)
            kv_l = kv_ptr + layer * s_kv_l + b * s_kv_b
            for h in range(HEADS):
                hd = h * D + dd
                wq = tl.load(qkv_w + lw + hd[None, :] * W + cols[:, None])  # [W, D]: rows h*D.. of W_q, transposed
                wk = tl.load(qkv_w + lw + (W + hd)[None, :] * W + cols[:, None])
                wv = tl.load(qkv_w + lw + (2 * W + hd)[None, :] * W + cols[:, None])
                bq = tl.load(qkv_b + layer * 3 * W + hd)
                bk = tl.load(qkv_b + layer * 3 * W + W + hd)
                bv = tl.load(qkv_b + layer * 3 * W + 2 * W + hd)
                q = _to(_mm(y, wq, WIDEN, PREC) + bq[None, :], WT, WIDEN)
                k_own = _to(_mm(y, wk, WIDEN, PREC) + bk[None, :], WT, WIDEN)
                v_own = _to(_mm(y, wv, WIDEN, PREC) + bv[None, :], WT, WIDEN)
                m_i = tl.full([BM], float("-inf"), tl.float32)
                l_i = tl.zeros([BM], tl.float32)
                acc = tl.zeros([BM, D], tl.float32)
                for start in range(0, n_prefix, BN):  # the layer's prefix keys/values, from the buffer
                    keys = start + tl.arange(0, BN)
                    kmask = keys < n_prefix
                    at = kv_l + keys[:, None] * s_kv_n + hd[None, :]
                    k = tl.load(at, mask=kmask[:, None], other=0.0)
                    v = tl.load(at + W, mask=kmask[:, None], other=0.0)
                    kb = tl.load(mask_ptr + b * s_m_b + keys, mask=kmask, other=float("-inf")).to(tl.float32)
                    m_i, l_i, acc = _attend(q, k, v, kb, m_i, l_i, acc, scale, WT, WIDEN, PREC)
                m_i, l_i, acc = _attend(q, k_own, v_own, own_bias, m_i, l_i, acc, scale, WT, WIDEN, PREC)
                o = _to(acc / l_i[:, None], WT, WIDEN)
                wo = tl.load(out_w + layer * W * W + cols[None, :] * W + hd[:, None])  # [D, W]: W_out's columns h*D..
                o_acc += _mm(o, wo, WIDEN, PREC)
            z += _round(o_acc + tl.load(out_b + layer * W + cols)[None, :], WT, WIDEN)
            y = _to(_norm(z, eps2, W), WT, WIDEN)
            mlp = tl.zeros([BM, W], tl.float32)
            for c in range(0, M, BC):
                mc = c + tl.arange(0, BC)
                w1 = tl.load(fc1_w + layer * M * W + mc[None, :] * W + cols[:, None])  # [W, BC]
                u = _mm(y, w1, WIDEN, PREC) + tl.load(fc1_b + layer * M + mc)[None, :]
                t = 0.7978845608028654 * (u + 0.044715 * u * u * u)
                g = _to(0.5 * u * (1.0 + (2.0 * tl.sigmoid(2.0 * t) - 1.0)), WT, WIDEN)  # tanh(t) = 2 sigmoid(2t) - 1
                w2 = tl.load(fc2_w + layer * W * M + cols[None, :] * M + mc[:, None])  # [BC, W]
                mlp += _mm(g, w2, WIDEN, PREC)
            z += _round(mlp + tl.load(fc2_b + layer * W + cols)[None, :], WT, WIDEN)
        y = _to(_norm(z, eps_out, W), WT, WIDEN)
        wo = tl.load(ow_ptr + aa[None, :] * W + cols[:, None], mask=amask[None, :], other=0.0)  # [W, A]
        v = _mm(y, wo, WIDEN, PREC) + tl.load(ob_ptr + aa, mask=amask, other=0.0)[None, :]
        at = v_ptr + b * s_v_b + rows[:, None] * s_v_h + aa[None, :]
        VT: tl.constexpr = v_ptr.dtype.element_ty
        tl.store(at, _to(v, VT, WIDEN).to(VT), mask=rmask[:, None] & amask[None, :])

    def _expert_step_triton(expert, stacked, x, step_bias, kv, mask):
        blocks = expert.blocks
        b = kv.shape[1]
        _, h, a = x.shape
        w = expert.width
        heads = blocks[0].heads
        dtype = blocks[0].qkv.weight.dtype
        v = torch.empty((b, h, a), dtype=dtype, device=x.device)
        _expert_step_kernel[(b,)](
            x,
            x.shape[0],
            x.stride(0),
            x.stride(1),
            expert.in_w,
            step_bias,
            step_bias.stride(0) if step_bias.dim() == 3 else 0,
            *(stacked[k] for k in _STACKED),
            kv,
            kv.stride(0),
            kv.stride(1),
            kv.stride(2),
            mask,
            mask.stride(0) if mask.shape[0] > 1 else 0,
            expert.out.weight,
            expert.out.bias,
            v,
            v.stride(0),
            v.stride(1),
            h,
            kv.shape[2] - h,
            blocks[0].eps1,
            blocks[0].eps2,
            expert.out_eps,
            1.0 / math.sqrt(w // heads),
            L=len(blocks),
            W=w,
            A=a,
            HEADS=heads,
            D=w // heads,
            M=blocks[0].fc1.weight.shape[0],
            BM=BLOCK_M,
            BC=BLOCK_C,
            BN=BLOCK_N,
            WIDEN=_widen(),
            PREC="ieee" if dtype == torch.float32 else "tf32",
            num_warps=NUM_WARPS,
        )
        return v


def expert_step(expert, x: torch.Tensor, step_bias: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor):
    """The velocity ``[B, H, A]`` the kernel gives, or None where it does not run (CPU, no ``triton``, compiling, or
    :func:`step_fits` says no): the caller then runs its own step. ``expert``: a
    :class:`~rollcap.policies.lean.LeanExpert` (its :meth:`~rollcap.policies.lean.LeanExpert.stacked` weights).

    ``x`` ``[N, H, A]`` with ``N`` dividing ``kv``'s batch ``B``: batch row ``b`` reads ``x[b % N]``, so the guidance
    branches' rows (``[N positive, N dropped]``) read one copy of the noisy actions (no ``repeat`` kernel)."""
    if (
        not _HAVE_TRITON
        or x.device.type not in KERNEL_DEVICES
        or torch.compiler.is_compiling()
        or step_fits(expert, x, step_bias, kv, mask) is not None
    ):
        return None
    return _expert_step_triton(expert, expert.stacked(), x.contiguous(), step_bias, kv, mask)


def step_facts(expert, device: torch.device | str) -> dict:
    """What a chunk's bits depend on of the lean ``expert``'s step on ``device`` (for a fingerprint; empty: the lean
    step runs, as it does without ``step_kernel``, on CPU, or where :func:`expert_fits` says no)."""
    if (
        expert.step_kernel
        and _HAVE_TRITON
        and torch.device(device).type in KERNEL_DEVICES
        and expert_fits(expert) is None
    ):
        return {
            "expert_step": f"{KERNEL} (BLOCK_M {BLOCK_M}, BLOCK_C {BLOCK_C}, BLOCK_N {BLOCK_N}, {NUM_WARPS} warps; triton {triton.__version__})"
        }
    return {}
