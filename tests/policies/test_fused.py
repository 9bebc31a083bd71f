"""The fused FlowVLA sampler: an equivalent re-parameterisation of today's checkpoints (close in fp32, not byte-equal)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rollcap.policies import PolicyRunner
from rollcap.policies.fused import MASK_ALIGN, FusedFlowVLA, additive_mask, fuse
from rollcap.policies import DEFAULT_CHECKPOINT, MT10_CHECKPOINT, load_policy
from tests.helpers import TINY_POLICY, make_noise, make_obs, tiny_policy
from tests.kernels._sampling import sampler_inputs

CHECKPOINTS = [
    DEFAULT_CHECKPOINT,
    MT10_CHECKPOINT,
    DEFAULT_CHECKPOINT.with_name("pushblock_policy_prefix.json"),
    MT10_CHECKPOINT.with_name("mt10_policy_prefix.json"),
]
TOL = 1e-5
"""Largest |fused - plain| accepted on a chunk in fp32 (measured: at most 6e-7 on the shipped checkpoints, actions ~1)."""


@pytest.mark.parametrize("path", CHECKPOINTS, ids=lambda p: p.stem)
def test_fused_equals_plain_on_shipped_checkpoints(path):
    """sample, sample_rows (batch 3) and, for a prefix-conditioned checkpoint, inpaint_sample: within TOL of the plain model."""
    plain = load_policy(path)
    fused = fuse(plain)
    cfg = plain.cfg
    with torch.no_grad():
        for seed in range(3):
            args = sampler_inputs(cfg, seed)
            a, b = plain.sample(*args), fused.sample(*args)
            assert (a - b).abs().max() < TOL and a.abs().max() > 0.01
        rows = sampler_inputs(cfg, 7, n=3)
        assert (plain.sample_rows(*rows) - fused.sample_rows(*rows)).abs().max() < TOL
        if cfg.prefix_conditioning:
            imgs, state, toks, noise = sampler_inputs(cfg, 9)
            w = torch.zeros(1, cfg.horizon, 1)
            w[:, :3] = 1.0
            carried = torch.randn(1, cfg.horizon, cfg.action_dim)
            a, b = (
                plain.inpaint_sample(imgs, state, toks, noise, carried, w),
                fused.inpaint_sample(imgs, state, toks, noise, carried, w),
            )
            assert (a - b).abs().max() < TOL
            assert torch.equal(b[:, :3], carried[:, :3])  # the pinned prefix is the carried actions exactly


def test_fused_is_smaller_work_and_leaves_the_plain_model_alone():
    """Fusing folds norms (no affine LayerNorm left in the blocks), fuses QKV, drops the unused final norm; the plain model is unchanged."""
    plain = tiny_policy()
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    fused = fuse(plain)
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in before.items())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in fused.expert.modules())
    assert not hasattr(fused.encoder, "ln_out")
    blk = fused.expert.blocks[0]
    assert blk.qkv.weight.shape == (3 * 32, 32)
    assert fused.expert.step_bias.shape == (TINY_POLICY.num_steps, TINY_POLICY.horizon, 32)
    with pytest.raises(TypeError, match="expected a FlowVLA"):
        fuse(fused)


def test_fused_narrow_expert_and_wide_mlp():
    """The re-parameterisation holds for a narrower expert with its own prefix projection and another MLP ratio."""
    cfg = dataclasses.replace(TINY_POLICY, expert_width=16, mlp_ratio=3, depth=2)
    plain = tiny_policy(cfg=cfg)
    with torch.no_grad():
        for p in plain.parameters():  # off the init values (LayerNorm gains 1, biases 0), or folding would be trivial
            p.add_(0.05 * torch.randn_like(p))
        fused = fuse(plain)
        args = sampler_inputs(cfg, 1)
        assert (plain.sample(*args) - fused.sample(*args)).abs().max() < TOL


def test_additive_mask_is_aligned_and_matches_the_boolean_one():
    """0 on valid keys and the extra ones, -inf on PAD; each row allocated to a multiple of MASK_ALIGN elements."""
    valid = torch.tensor([[True, False, True], [True, True, False]])
    m = additive_mask(valid, extra=2)
    assert m.shape == (2, 1, 1, 5) and m.stride(0) % MASK_ALIGN == 0 and m.stride(-1) == 1
    want = torch.tensor([[0, -float("inf"), 0, 0, 0], [0, 0, -float("inf"), 0, 0]])
    assert torch.equal(m[:, 0, 0], want)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert additive_mask(valid).dtype == torch.bfloat16  # the dtype attention runs in: no cast per call


def test_fused_runner_fingerprint_names_the_variant_and_its_jit_plan_is_exact():
    """A runner of the fused model: 'variant: fused' in its fingerprint (the plain one has none); jit replay == its own eager."""
    plain = tiny_policy()
    runners = [PolicyRunner(m, backend="jit") for m in (plain, fuse(plain))]
    try:
        fp_plain, fp_fused = (r.state_fingerprint() for r in runners)
        assert "variant" not in fp_plain["config"] and fp_fused["config"]["variant"] == "fused"
        assert fp_plain["weights_digest"] != fp_fused["weights_digest"]
        obs, noise = make_obs(0), make_noise(0)
        a = runners[1].act(obs, noise)
        assert np.array_equal(a, runners[1].act_eager(obs, noise))
        assert np.array_equal(a, runners[1].act(obs, noise))
        assert np.abs(a - runners[0].act(obs, noise)).max() < TOL
        assert isinstance(runners[1].model, FusedFlowVLA)
    finally:
        for r in runners:
            r.close()


_CHILD = """
import sys, hashlib
sys.path.insert(0, {root!r})
from tests.policies.test_fused import fused_chunk_digest
print(fused_chunk_digest())
"""


def fused_chunk_digest() -> str:
    """sha256 of the fused shipped policy's jit chunks for three observations."""
    import hashlib

    runner = PolicyRunner(fuse(load_policy(DEFAULT_CHECKPOINT)), backend="jit")
    try:
        h = hashlib.sha256()
        for seed in range(3):
            obs = make_obs(seed, image_size=64, state_dim=28)
            h.update(runner.act(obs, make_noise(seed, horizon=8)).tobytes())
        return h.hexdigest()
    finally:
        runner.close()


@pytest.mark.slow(seconds=15)
def test_fused_chunks_are_the_same_bytes_in_another_process():
    """The fused shipped policy's jit chunks: byte-identical in a fresh process (the fusion is deterministic)."""
    import pathlib
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == fused_chunk_digest()


def test_fusion_does_not_depend_on_the_callers_threads():
    """fuse() gives the same weights whatever the caller's intra-op thread budget (a worker at 1 thread and a fresh
    process at 2 fused differently, so their chunks differed)."""
    outer = torch.get_num_threads()
    model = load_policy(DEFAULT_CHECKPOINT)
    try:
        got = []
        for n in (1, 2):
            torch.set_num_threads(n)
            got.append({k: v.clone() for k, v in fuse(model).state_dict().items()})
    finally:
        torch.set_num_threads(outer)
    assert got[0].keys() == got[1].keys() and all(torch.equal(got[0][k], got[1][k]) for k in got[0])
