"""The fp8 precision: float8 e4m3 linears with per-output-channel weight scales (torch._scaled_mm), refused where the
hardware lacks float8 tensor cores. ``torch._scaled_mm`` runs on CPU too, so the module is checked here against the
dequantised reference; the captured-graph checks need a GPU (cuda-marked)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rollcap.kernels.fp8 import FP8, Fp8Linear, fp8_facts, fp8_supported, quantize_weight, to_fp8
from rollcap.kernels.guard import guarded
from rollcap.kernels.ops import quantize_rows_fp8, quantize_rows_fp8_reference
from rollcap.kernels.precision import PRECISIONS, check_precision, precision_context


def test_fp8_is_refused_on_cpu_in_one_line_naming_what_to_use():
    assert "fp8" in PRECISIONS and not fp8_supported("cpu")
    with pytest.raises(ValueError) as info:
        check_precision("fp8", "cpu")
    msg = str(info.value)
    assert "\n" not in msg and "compute capability 8.9" in msg and "use bf16" in msg


def test_row_quantisation_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g) * torch.logspace(-3, 2, 6)[:, None]
    q, s = quantize_rows_fp8(x)  # on CPU: the reference
    assert q.dtype == FP8 and s.shape == (6, 1) and s.dtype == torch.float32
    assert torch.equal(s, x.abs().amax(1, keepdim=True) / 448.0)
    assert q.float().abs().amax(1).eq(448.0).all()  # each row's largest value lands on e4m3's largest
    err = (q.float() * s - x).abs() / x.abs().amax(1, keepdim=True)
    assert err.max() <= 16.0 / 448.0 * 1.0001  # e4m3: at most half the top binade's step (32) of the row's max (448)
    zero_q, zero_s = quantize_rows_fp8_reference(torch.zeros(2, 16))
    assert zero_q.float().eq(0).all() and (zero_s > 0).all()


def test_fp8_linear_matches_its_dequantised_reference_and_is_deterministic():
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(64, 48).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g) / 8)
        lin.bias.copy_(torch.randn(48, generator=g))
    f = Fp8Linear(lin)
    x = torch.randn(2, 5, 64, generator=g).to(torch.bfloat16)
    with torch.no_grad(), precision_context("bf16", "cpu"):
        a = f(x)
        with guarded("fp8"):  # capturable: no host reads, no host data, no draws
            b = f(x)
        c = f(quantize_rows_fp8(x))  # a (q, scale) pair: the lean sampler's fused norm hands this
    assert a.dtype == torch.bfloat16 and a.shape == (2, 5, 48)
    assert torch.equal(a, b) and torch.equal(a, c)
    q, s = quantize_rows_fp8(x.reshape(-1, 64))
    w8, sw = quantize_weight(lin.weight)
    ref = (q.float() * s) @ (w8.float() * sw.t()).t() + lin.bias.float()
    assert (a.reshape(-1, 48).float() - ref).abs().max() <= 0.02 * ref.abs().max()
    exact = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
    assert (a.float() - exact).abs().max() <= 0.1 * exact.abs().max()  # fp8's own error vs the bf16 weights: a few %


def test_to_fp8_converts_only_the_scope_and_says_so():
    class M(nn.Module):
        FP8_SCOPE = ("inner",)

        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 14))  # 14: not a multiple of 16
            self.outer = nn.Linear(32, 32)

    m = to_fp8(M())
    assert isinstance(m.inner[0], Fp8Linear) and isinstance(m.inner[2], nn.Linear) and isinstance(m.outer, nn.Linear)
    facts = fp8_facts(m)
    assert facts["fp8_linears"] == 1 and "per output channel" in facts["fp8"]
    assert to_fp8(nn.Linear(32, 32)).__class__ is nn.Linear  # no scope: unchanged (it runs bf16)


def test_policy_runner_at_fp8_is_refused_on_cpu_before_any_conversion():
    from rollcap.policies import PolicyRunner
    from tests.helpers import tiny_policy

    with pytest.raises(ValueError, match="policy: fp8 needs float8 tensor cores"):
        PolicyRunner(tiny_policy(), precision="fp8")


@pytest.mark.cuda
def test_fp8_policy_graph_equals_its_eager_on_a_gpu():
    """On a GPU with float8 tensor cores: the lean sampler at fp8, CUDA graph vs its own eager chunk, byte for byte."""
    if not fp8_supported("cuda"):
        pytest.skip("this GPU has no float8 tensor cores")
    from rollcap.policies.lean import lean
    from rollcap.policies.sizes import build, size_config
    from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs

    cfg = size_config("26m")
    model = lean(build(cfg, "cuda"))
    ins, outs = _buffers(cfg, "cuda")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    eager = _graph(model, ins, outs, "eager", "fp8")
    eager.replay()
    want = outs["actions"].clone()
    _graph(model, ins, outs, "cuda", "fp8").replay()
    assert torch.equal(outs["actions"], want)
    x = torch.randn(100, 1024, device="cuda")
    q, s = quantize_rows_fp8(x)
    rq, rs = quantize_rows_fp8_reference(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
