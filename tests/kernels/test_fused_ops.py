"""The fused ops of the lean sampler (add_layernorm, linear_gelu): Triton kernels against their torch references.

The references run on CPU everywhere. The Triton kernels run on CPU through Triton's interpreter
(``TRITON_INTERPRET=1``, in a child process: the setting is read when a kernel is defined) where ``triton`` imports,
and skip cleanly where it does not (CI).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from rollcap.kernels.ops import (
    add_layernorm,
    add_layernorm_reference,
    kernel_facts,
    linear_gelu,
    linear_gelu_reference,
)

BF16_ULP = 2.0**-7
"""The bound of a bf16 output against its reference: one bf16 rounding step of the value (|diff| <= 2^-7 |ref|); fp32: 2e-6."""


def _rows(w: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, w, generator=g) * 3.0 + 0.5
    d = (torch.randn(2, 5, w, generator=g)).to(torch.bfloat16)
    return x, d


def test_add_layernorm_reference_is_the_unfused_ops():
    """On CPU the entry point is the reference, which is exactly add, layer_norm (no affine), cast."""
    x, d = _rows(96)
    for out in (torch.float32, torch.bfloat16):
        got_x, got_y = add_layernorm(x, d, 1e-5, out)
        want_x = x + d
        want_y = F.layer_norm(want_x, (96,), eps=1e-5).to(out)
        assert torch.equal(got_x, want_x) and torch.equal(got_y, want_y) and got_y.dtype == out
    same_x, y = add_layernorm(x, None, 1e-6, torch.float32)
    assert same_x is x and torch.equal(y, F.layer_norm(x, (96,), eps=1e-6))


def test_add_layernorm_takes_the_autocast_dtype():
    x, d = _rows(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, y = add_layernorm(x, d, 1e-5)
    assert y.dtype == torch.bfloat16
    assert add_layernorm(x, d, 1e-5)[1].dtype == torch.float32


def test_linear_gelu_reference_on_cpu_is_linear_then_tanh_gelu():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(3, 7, 16, generator=g), torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    want = F.gelu(F.linear(x, w, b), approximate="tanh")
    assert torch.equal(linear_gelu(x, w, b), want) and torch.equal(linear_gelu_reference(x, w, b), want)


def test_kernel_facts_name_the_kernels():
    assert kernel_facts("cpu") == {"fused_ops": "torch"}


_INTERPRETED = textwrap.dedent(
    """
    import torch
    from rollcap.kernels import ops
    assert ops._HAVE_TRITON
    g = torch.Generator().manual_seed(0)
    worst = {}
    for w in (8, 100, 128, 1000, 2560):
        x = torch.randn(3, 7, w, generator=g) * 3 + 1
        d = torch.randn(3, 7, w, generator=g).to(torch.bfloat16)
        for dd in (d, None):
            for out in (torch.float32, torch.bfloat16):
                gx, gy = ops._add_ln_triton(x, dd, 1e-5, out)
                rx, ry = ops.add_layernorm_reference(x, dd, 1e-5, out)
                assert torch.equal(gx, rx), "residual differs"
                assert gy.dtype == out and gy.shape == ry.shape
                bound = (ry.float().abs() * 2.0**-7 + 1e-6) if out == torch.bfloat16 else torch.full_like(rx, 2e-6)
                over = ((gy.float() - ry.float()).abs() - bound).max().item()
                assert over <= 0, f"w {w} {out}: over the bound by {over}"
    def same_codes(got, want):
        # Triton 3.9's interpreter converts to float8 without carrying a rounded-up mantissa into the exponent
        # (127.9 -> 64, not 128) and flushes subnormals (below 2^-6) to 0; the GPU's cvt.rn.satfinite does neither.
        # Those codes, and only those, may differ here (the cuda-marked test wants every code equal).
        diff = got.view(torch.uint8) != want.view(torch.uint8)
        a, b = got.float()[diff], want.float()[diff]
        return bool(((a * 2 == b) | ((a == 0) & (b.abs() < 2.0**-6))).all())

    x = torch.randn(3, 7, 1000, generator=g) * 3
    q, s = ops._quant_rows_triton(x)
    rq, rs = ops.quantize_rows_fp8_reference(x)
    assert torch.equal(s, rs) and same_codes(q, rq)
    d = torch.randn(3, 7, 1000, generator=g).to(torch.bfloat16)
    (gx, (q, s)), (rx, (rq, rs)) = ops._add_ln_triton(x, d, 1e-5, ops.FP8), ops.add_layernorm_reference(x, d, 1e-5, ops.FP8)
    assert torch.equal(gx, rx) and torch.allclose(s, rs, rtol=1e-5, atol=0)
    keep = ~(((q.float() * 2 == rq.float()) | (q.float() == 0)) & (q.view(torch.uint8) != rq.view(torch.uint8)))
    step = rs * 32.0  # one step of e4m3's top binade, in the row's units
    assert (((q.float() * s - rq.float() * rs).abs() - step) * keep).max() <= 0
    h = (torch.randn(3, 7, 1000, generator=g) * 2).to(torch.bfloat16)
    (q, s), (rq, rs) = ops._gelu_quant_rows_triton(h), ops.gelu_quantize_rows_fp8_reference(h)
    assert torch.equal(s, rs)  # the row maxima agree; a code may move by one step (tanh through sigmoid vs ATen's tanh)
    keep = ~(((q.float() * 2 == rq.float()) | (q.float() == 0)) & (q.view(torch.uint8) != rq.view(torch.uint8)))
    assert (((q.float() * s - rq.float() * rs).abs() - rs * 32.0) * keep).max() <= 0
    x, vu, vc = (torch.randn(2, 50, 7, generator=g) for _ in range(3))
    assert torch.allclose(ops._cfg_euler_triton(x, vu, vc, -0.1, 1.5), ops.cfg_euler_step_reference(x, vu, vc, -0.1, 1.5), rtol=0, atol=1e-6)
    print("ok")
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (CI): the references are tested above"
)
def test_triton_kernels_match_their_references_in_the_interpreter():
    """add_layernorm's and cfg_euler_step's Triton kernels on CPU (TRITON_INTERPRET=1) against the references:
    the residual bit-equal, the norm within one bf16 rounding step (bf16 out) or 2e-6 (fp32 out)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


@pytest.mark.cuda
def test_fused_ops_on_cuda_match_their_references():
    """On a GPU: the Triton norm and the cuBLASLt bias+GELU epilogue against the references (bf16 bounds)."""
    from rollcap.kernels.ops import triton_available

    x, d = (t.cuda() for t in _rows(2560))
    if triton_available():
        gx, gy = add_layernorm(x, d, 1e-5, torch.bfloat16)
        rx, ry = add_layernorm_reference(x, d, 1e-5, torch.bfloat16)
        assert torch.equal(gx, rx)
        assert ((gy.float() - ry.float()).abs() <= ry.float().abs() * BF16_ULP + 1e-6).all()
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = torch.randn(100, 1024, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(4096, 1024, device="cuda", generator=g) / 32).to(torch.bfloat16)
    b = torch.randn(4096, device="cuda", generator=g).to(torch.bfloat16)
    got, want = linear_gelu(xs, w, b).float(), linear_gelu_reference(xs, w, b).float()
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()
