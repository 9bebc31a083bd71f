"""The lean FlowVLA sampler: the fused sampler with its residual adds in the norms and bias+GELU in the GEMM epilogue.

On CPU every fused op is its torch reference, so a lean chunk is the fused sampler's chunk byte for byte (the bound of
the reference against the unfused module is 0 there); on CUDA the cuda-marked test bounds the difference.
"""

from __future__ import annotations

import pytest
import torch

from rollcap.kernels.graph import CapturedGraph
from rollcap.kernels.precision import cast_linears
from rollcap.policies import PolicyRunner
from rollcap.policies.fused import fuse
from rollcap.policies.lean import LeanFlowVLA, lean
from rollcap.policies import DEFAULT_CHECKPOINT, MT10_CHECKPOINT, load_policy
from rollcap.policies.sizes import build, size_config
from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs
from tests.helpers import make_noise, make_obs


@pytest.mark.parametrize(
    "path", [DEFAULT_CHECKPOINT, MT10_CHECKPOINT.with_name("mt10_policy_prefix.json")], ids=lambda p: p.stem
)
def test_lean_equals_fused_byte_for_byte_on_cpu(path):
    """sample, sample_rows and inpaint / guided sampling: the same bytes as the fused sampler, fp32 and bf16."""
    plain = load_policy(path)
    f, g = fuse(plain), lean(plain)
    cfg = plain.cfg
    gen = torch.Generator().manual_seed(0)
    imgs = [
        torch.randint(0, 256, (1, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8, generator=gen)
        for _ in cfg.image_keys
    ]
    state, noise = (
        torch.randn(1, cfg.state_dim, generator=gen),
        torch.randn(1, cfg.horizon, cfg.action_dim, generator=gen),
    )
    from rollcap.policies.observation import tokenize

    toks = torch.from_numpy(tokenize("push the block", cfg.max_tokens))[None]
    w = torch.zeros(1, cfg.horizon, 1)
    w[:, :2] = 1.0
    carried = torch.randn(1, cfg.horizon, cfg.action_dim, generator=gen)
    for precision in (None, torch.bfloat16):
        ctx = (
            torch.autocast("cpu", dtype=precision, cache_enabled=False)
            if precision
            else torch.autocast("cpu", enabled=False)
        )
        with torch.no_grad(), ctx:
            assert torch.equal(f.sample(imgs, state, toks, noise), g.sample(imgs, state, toks, noise))
            rows = (
                [i.expand(3, -1, -1, -1) for i in imgs],
                state.expand(3, -1),
                toks.expand(3, -1),
                noise.expand(3, -1, -1),
            )
            assert torch.equal(f.sample_rows(*rows), g.sample_rows(*rows))
            name = "inpaint_sample" if cfg.prefix_conditioning else "guided_sample"
            a = getattr(f, name)(imgs, state, toks, noise, carried, w)
            assert torch.equal(a, getattr(g, name)(imgs, state, toks, noise, carried, w))


def test_lean_graphs_equal_their_eager_reference_and_pass_the_guard():
    """Every captured CPU plan (jit; the guard runs in its warm-up) equals its own eager chunk, at fp32 and bf16, on a
    named size with a narrow expert and a wide MLP (the 3b shape, scaled down)."""
    import dataclasses

    cfg = dataclasses.replace(size_config("3b"), width=64, expert_width=32, depth=2, heads=4, image_size=28, horizon=6)
    model = lean(build(cfg))
    ins, outs = _buffers(cfg, "cpu")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    for precision in ("fp32", "bf16"):
        eager = _graph(model, ins, outs, "eager", precision)
        eager.replay()
        want = outs["actions"].clone()
        g = _graph(model, ins, outs, "jit", precision)
        g.replay()
        assert torch.equal(outs["actions"], want) and want.abs().max() > 0


def test_lean_runner_fingerprint_and_bf16_weights():
    """'variant: lean', fused_from and the kernels in the fingerprint; cast_linears stores the expert's batched prefix
    projection and input weights in bf16 too (CAST_PARAMS), and the policy chunk is exact to its eager reference."""
    plain = load_policy(DEFAULT_CHECKPOINT)
    runner = PolicyRunner(lean(plain, "sha256:abc"), backend="jit", precision="bf16")
    try:
        fp = runner.state_fingerprint()
        assert fp["config"]["variant"] == "lean" and fp["config"]["fused_from"] == "sha256:abc"
        assert fp["fused_ops"] == "torch" and fp["precision"] == "bf16"
        obs, noise = make_obs(0, image_size=64, state_dim=28), make_noise(0, horizon=8)
        assert runner.act(obs, noise).tobytes() == runner.act_eager(obs, noise).tobytes()
    finally:
        runner.close()
    cast = cast_linears(lean(plain))
    e = cast.expert
    assert e.prefix_w.dtype == e.prefix_b.dtype == e.in_w.dtype == torch.bfloat16
    assert cast.expert.blocks[0].fc1.weight.dtype == torch.bfloat16 and cast.expert.step_bias.dtype == torch.float32
    assert isinstance(cast, LeanFlowVLA)


def test_lean_refuses_a_non_flowvla():
    with pytest.raises(TypeError, match="lean: expected a FlowVLA"):
        lean(torch.nn.Linear(2, 2))


@pytest.mark.cuda
def test_lean_cuda_graph_equals_its_eager_and_is_close_to_fused():
    """On a GPU at bf16: the lean CUDA graph equals its own eager chunk byte for byte; it differs from the fused
    sampler's chunk by the Triton norm's and the epilogue GELU's rounding only (bounded, actions ~1)."""
    cfg = size_config("26m")
    plain = build(cfg, "cuda")
    ins, outs = _buffers(cfg, "cuda")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    chunks = {}
    for name, m in (("fused", fuse(plain)), ("lean", lean(plain))):
        eager = _graph(m, ins, outs, "eager", "bf16")
        eager.replay()
        chunks[name] = outs["actions"].clone()
        g = _graph(m, ins, outs, "cuda", "bf16")
        g.replay()
        assert isinstance(g, CapturedGraph)
        assert torch.equal(outs["actions"], chunks[name]), name
    assert (chunks["lean"] - chunks["fused"]).abs().max().item() < 0.1


def test_fp8_expert_on_the_shipped_policy_lean_equals_fused_and_stays_near_bf16():
    """At fp8 (checked on CPU through torch._scaled_mm's CPU kernel; a CPU *run* at fp8 is refused): only the expert
    blocks' linears are float8; the lean and fused samplers agree closely (the lean MLP quantises its fp32 GELU in one
    pass, the fused one its bf16-rounded GELU); each chunk stays within FP8_TOL of the bf16 chunk on the trained
    shipped policy."""
    from rollcap.kernels.fp8 import Fp8Linear, to_fp8
    from rollcap.kernels.precision import precision_context

    plain = load_policy(DEFAULT_CHECKPOINT)
    cfg = plain.cfg
    ins, outs = _buffers(cfg, "cpu")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    f8, l8 = (to_fp8(cast_linears(m)) for m in (fuse(plain), lean(plain)))
    assert sum(isinstance(m, Fp8Linear) for m in l8.modules()) == 4 * cfg.depth
    assert not any(isinstance(m, Fp8Linear) for m in l8.encoder.modules())
    b = ins.tensors()
    args = ([b[k] for k in cfg.image_keys], b["state"], b["tokens"], b["noise"])
    with torch.no_grad(), precision_context("bf16", "cpu"):
        a, c = f8.sample(*args), l8.sample(*args)
        ref = fuse(plain).sample(*args)
    assert (a - c).abs().max() < FP8_TOL / 4
    assert (a - ref).abs().max() < FP8_TOL and (c - ref).abs().max() < FP8_TOL and ref.abs().max() > 0.1


FP8_TOL = 0.1
"""fp8 vs bf16 on the shipped policy's chunk (actions ~1): measured at most 0.022 (lean) over 5 bench inputs on CPU (MT10: 0.043)."""


def test_replay_takes_the_lean_sampler_and_fp8_back_from_the_recording(monkeypatch):
    """A lean fp8 CUDA recording: replayed with the lean sampler and the shipped checkpoint it was built from, at fp8
    where CUDA is here, at bf16 (its non-float8 part) on a CPU machine, each said in one line."""
    from types import SimpleNamespace

    from rollcap.kernels.fingerprint import tensor_digest
    from rollcap.rollout.offline.deployment import recorded_parts

    digest = tensor_digest(dict(load_policy(DEFAULT_CHECKPOINT).state_dict()))
    pol = {
        "device_kind": "cuda",
        "cuda_device": "NVIDIA H100 80GB HBM3",
        "component": "policy",  # a captured runner's
        "backend": "cuda",
        "precision": "fp8",
        "weights_digest": "sha256:lean-weights",
        "config": {"variant": "lean", "fused_from": digest},
    }
    rec = SimpleNamespace(fingerprints={"policy": pol})
    unset = {"device": None, "backend": None, "precision": None, "policy": None, "critic": None, "threads": 1}
    monkeypatch.setattr("rollcap.rollout.offline.deployment._cuda_here", lambda: 1)
    parts, said = recorded_parts(dict(unset), rec, "r")
    assert (parts["sampler"], parts["precision"], parts["policy"]) == ("lean", "fp8", DEFAULT_CHECKPOINT)
    assert "r: recorded with the lean sampler: replaying with it" in said
    monkeypatch.setattr("rollcap.rollout.offline.deployment._cuda_here", lambda: 0)
    parts, _ = recorded_parts(dict(unset), rec, "r")
    assert (parts["device"], parts["precision"], parts["sampler"]) == ("cpu", "bf16", "lean")
