"""The action expert's attention kernel (kernels/attention.py) against its reference, the lean block's SDPA path.

The reference runs on CPU everywhere (it is what the lean sampler computes there, byte for byte). The Triton kernel
runs on CPU through Triton's interpreter (``TRITON_INTERPRET=1``, in a child process) where ``triton`` imports, and
skips cleanly where it does not (CI); the cuda-marked test runs it compiled, and captures it in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import textwrap

import pytest
import torch

from rollcap.kernels.attention import attention_facts, expert_attention, expert_attention_reference, kernel_fits
from rollcap.policies.fused import additive_mask, with_room
from rollcap.policies.lean import lean
from rollcap.policies.sizes import build, size_config
from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs
from tests.kernels._sampling import eager_chunks, run_interpreted


def _operands(b=2, n=50, heads=4, d=32, n_prefix=70, dtype=torch.float32, seed=0, lead_pad=False):
    """``qkv``, a key/value buffer with room, and an additive key mask with PAD keys (a whole leading block of them
    with ``lead_pad``: the kernel's first key blocks then hold no valid key)."""
    g = torch.Generator().manual_seed(seed)
    w = heads * d
    qkv = (torch.randn(b, n, 3 * w, generator=g) * 1.5).to(dtype)
    kv = with_room(torch.randn(1, b, n_prefix, 2, heads, d, generator=g).to(dtype), n)[0]
    valid = torch.ones(b, n_prefix, dtype=torch.bool)
    valid[:, n_prefix - 9 : n_prefix - 2] = False  # PAD tokens between the prompt and the last prefix token
    valid[-1, 3:17] = False
    if lead_pad:
        valid[:, :80] = False
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        mask = additive_mask(valid, n)
    return qkv, kv, mask, heads


def test_the_reference_writes_the_tokens_keys_and_attends_over_the_buffer():
    """On CPU the entry point is the reference: the tokens' keys/values land in the buffer's last rows and the output
    is SDPA's over the whole buffer, in the [B, H, width] layout (a float64 softmax written out agrees)."""
    qkv, kv, mask, h = _operands()
    before = kv.clone()
    o = expert_attention(qkv, kv, mask, h)
    b, n, w3 = qkv.shape
    w, d = w3 // 3, w3 // 3 // h
    assert o.shape == (b, n, w) and torch.equal(kv[:, :-n], before[:, :-n])
    assert torch.equal(kv[:, -n:], qkv[..., w:].view(b, n, 2, h, d))
    q = qkv[..., :w].double().view(b, n, h, d).transpose(1, 2)
    k, v = kv.double()[:, :, 0].transpose(1, 2), kv.double()[:, :, 1].transpose(1, 2)
    p = torch.softmax(q @ k.transpose(-1, -2) / d**0.5 + mask.double(), dim=-1)
    want = (p @ v).transpose(1, 2).reshape(b, n, w)
    assert (o.double() - want).abs().max() < 1e-5


def test_kernel_fits_names_what_it_cannot_read():
    qkv, kv, mask, h = _operands()
    assert kernel_fits(qkv, kv, mask, h) is None
    assert kernel_fits(*_operands(d=8)[:3], 4).startswith("head_dim 8")
    assert kernel_fits(*_operands(d=48)[:3], 4).startswith("head_dim 48")
    assert "one additive key row" in kernel_fits(qkv, kv, mask.expand(2, 1, 50, mask.shape[-1]), h)
    assert "qkv's dtype" in kernel_fits(qkv, kv.double(), mask, h)
    assert "kv_buf: shape" in kernel_fits(qkv, kv[:, :, :, :2], mask, h)
    assert "batch 3" in kernel_fits(qkv, kv, torch.cat([mask, mask[:1]]), h)
    assert kernel_fits(qkv, kv, mask[:1], h) is None  # one row for every batch row


def test_cpu_takes_the_reference_and_says_nothing_in_the_fingerprint():
    """On CPU a lean sampler built with the kernel is the lean sampler's bytes (the reference runs) and its
    fingerprint facts are the same; on CUDA they name the kernel."""
    cfg = dataclasses.replace(size_config("3b"), width=64, expert_width=32, depth=2, heads=2, image_size=28, horizon=6)
    plain = build(cfg)
    a, b = lean(plain), lean(plain, attention_kernel=True)
    assert b.expert.attention_kernel and not a.expert.attention_kernel
    assert a.fingerprint_facts("cpu") == b.fingerprint_facts("cpu") and attention_facts(True, "cpu") == {}
    assert torch.equal(*eager_chunks(cfg, (a, b)))


_INTERPRETED = textwrap.dedent(
    """
    import dataclasses, sys, torch
    sys.path.insert(0, {tests!r})
    from rollcap.kernels import attention as A
    from rollcap.policies.lean import lean
    from rollcap.policies.sizes import build, size_config
    from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs
    from kernels.test_expert_attention import _operands
    assert A._HAVE_TRITON
    A.KERNEL_DEVICES = ("cuda", "cpu")
    # the kernel against a float64 softmax, beside the reference's own error
    for dtype, bound in ((torch.float32, 2e-6), (torch.bfloat16, 2.0**-6)):
        for kw in ({{}}, {{"b": 4, "n": 8, "heads": 2, "d": 16, "n_prefix": 130}}, {{"d": 64, "n_prefix": 64}},
                   {{"n_prefix": 150, "lead_pad": True}}):
            qkv, kv, mask, h = _operands(dtype=dtype, **kw)
            assert A.kernel_fits(qkv, kv, mask, h) is None
            got = A._expert_attention_triton(qkv, kv, mask, h)
            assert got.dtype == dtype and torch.equal(kv[:, -qkv.shape[1]:], torch.zeros_like(kv[:, -qkv.shape[1]:]))
            exact = A.expert_attention_reference(qkv.double(), kv.double(), mask.double(), h)
            ref = A.expert_attention_reference(qkv, kv.clone(), mask, h)
            err, ref_err = ((t.double() - exact).abs().max().item() for t in (got, ref))
            top = exact.abs().max().item()
            assert err <= bound * top, (dtype, kw, err, ref_err, top)
            # one mask row for every batch row reads the same row
            assert torch.equal(A._expert_attention_triton(qkv, kv, mask[:1].expand_as(mask), h),
                               A._expert_attention_triton(qkv, kv, mask[:1], h))
    # a whole lean sampler with the kernel in every expert block (the 3b shape scaled down), and its rows path
    cfg = dataclasses.replace(size_config("3b"), width=64, expert_width=32, depth=2, heads=2, image_size=28, horizon=6)
    plain = build(cfg)
    ins, outs = _buffers(cfg, "cpu")
    ins.write({{k: torch.from_numpy(v) for k, v in _inputs(cfg).items()}})
    chunks = []
    for m in (lean(plain), lean(plain, attention_kernel=True)):
        _graph(m, ins, outs, "eager", "fp32").replay()
        chunks.append(outs["actions"].clone())
    diff = (chunks[0] - chunks[1]).abs().max().item()
    assert 0 < diff < 1e-5, diff
    assert "expert_attention" in lean(plain, attention_kernel=True).fingerprint_facts("cpu")
    # the shipped checkpoint: sample, sample_rows (3 rows: batch 6 through the kernel) and RTC's guided sampling,
    # in fp32 and under bf16 autocast (the kernel then reads bf16 operands)
    from rollcap.policies.runner import DEFAULT_CHECKPOINT, load_policy
    from kernels._sampling import compare_samplers
    plain = load_policy(DEFAULT_CHECKPOINT)
    diffs = compare_samplers(lean(plain), lean(plain, attention_kernel=True), ((None, 1e-5), (torch.bfloat16, 0.02)))
    print("ok", diff, diffs)
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (CI): the reference is tested above"
)
def test_the_kernel_matches_a_float64_softmax_in_the_interpreter():
    """The Triton kernel on CPU (TRITON_INTERPRET=1): within 2e-6 (fp32) or 2^-6 (bf16, its probabilities rounded to
    bf16 before the second product, as flash attention does) of the largest output, against a float64 softmax; the
    buffer's last rows are left alone; a lean sampler with it in every expert block is within 1e-5 of without (fp32;
    the shipped checkpoint's sample, sample_rows and guided sampling too, and within 0.02 under bf16 autocast)."""
    run_interpreted(_INTERPRETED)


@pytest.mark.cuda
def test_the_kernel_on_cuda_and_in_a_cuda_graph():
    """On a GPU: the compiled kernel against the float64 softmax at fp32 and bf16, and a lean bf16 sampler with it
    captured in a CUDA graph equals its own eager chunk byte for byte (and stays near the SDPA path)."""
    from rollcap.kernels.ops import triton_available

    if not triton_available():
        pytest.skip("triton is not importable")
    for dtype, bound in ((torch.float32, 2e-6), (torch.bfloat16, 2.0**-6)):
        qkv, kv, mask, h = (t.cuda() if torch.is_tensor(t) else t for t in _operands(dtype=dtype, d=64))
        got = expert_attention(qkv, kv, mask, h)
        exact = expert_attention_reference(qkv.double(), kv.double(), mask.double(), h)
        assert (got.double() - exact).abs().max().item() <= bound * exact.abs().max().item()
    cfg = size_config("26m")
    plain = build(cfg, "cuda")
    ins, outs = _buffers(cfg, "cuda")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    chunks = []
    for m in (lean(plain), lean(plain, attention_kernel=True)):
        eager = _graph(m, ins, outs, "eager", "bf16")
        eager.replay()
        want = outs["actions"].clone()
        g = _graph(m, ins, outs, "cuda", "bf16")
        g.replay()
        assert torch.equal(outs["actions"], want)
        chunks.append(want)
    assert (chunks[0] - chunks[1]).abs().max().item() < 0.1


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (CI)")
@pytest.mark.parametrize(("dtype", "prec", "d"), [("bf16", "tf32", 64), ("fp32", "ieee", 64), ("bf16", "tf32", 32)])
def test_the_kernel_compiles_for_an_h100_without_one(dtype, prec, d):
    """Triton compiles the kernel ahead of time for sm90 (its bundled ptxas; no GPU needed): a shape or dtype the
    GPU's compiler refuses fails here, not in a device session. bf16 products take tensor cores (``mma``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rollcap.kernels import attention as A

    ints = ("n", "n_prefix", "heads", "s_qkv_b", "s_qkv_n", "s_kv_b", "s_kv_n", "s_m_b", "s_o_b", "s_o_n")
    sig = {"qkv_ptr": f"*{dtype}", "kv_ptr": f"*{dtype}", "mask_ptr": "*fp32", "o_ptr": f"*{dtype}"}
    sig |= {a: "i32" for a in ints} | {"scale": "fp32"}
    const = {"W": 16 * d, "D": d, "BM": A.BLOCK_M, "BN": A.BLOCK_N, "WIDEN": False, "PREC": prec}
    sig |= {k: "constexpr" for k in const}
    k = triton.compile(ASTSource(A._expert_attn_kernel, sig, const), target=GPUTarget("cuda", 90, 32))
    assert k.asm["cubin"] and (("mma" in k.asm["ptx"]) == (dtype == "bf16"))
