"""A shared guidance prefix (``shared_prefix``): the observation runs once per chunk, the advantage token per branch.

The model it computes is the full-sequence prefix with the observation's rows masked off the advantage key; the
reference below builds that mask explicitly and runs the plain blocks over the whole sequence, so the test does not
lean on the decomposition it checks.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from rollcap.policies.flow_vla import ADV_DROPPED, ADV_POSITIVE, FlowVLAConfig
from rollcap.policies.fused import fuse
from rollcap.policies.lean import lean
from rollcap.policies.rtc import guided_sample
from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.runner import load_policy
from rollcap.policies.sizes import SIZES, build, chunk_flops, roofline_ms, size_config, weight_floor
from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs

SMALL = dataclasses.replace(SIZES["26m"], width=64, depth=2, heads=4, shared_prefix=True)


def _obs(cfg, n=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    imgs = [
        torch.randint(0, 256, (n, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8, generator=gen)
        for _ in cfg.image_keys
    ]
    tokens = torch.from_numpy(_inputs(cfg)["tokens"]).expand(n, -1)
    state = torch.randn(n, cfg.state_dim, generator=gen)
    return imgs, state, tokens, torch.randn(n, cfg.horizon, cfg.action_dim, generator=gen)


def _masked_reference(model, images, state, tokens, adv):
    """The expert's prefix keys/values from the whole sequence, the observation's rows masked off the last key."""
    enc = model.encoder
    x, valid = enc.embed(images, state, tokens, model.adv_emb(adv)[:, None, :])
    b, n, w = x.shape
    mask = valid[:, None, :].expand(b, n, n).clone()
    mask[:, : n - 1, n - 1] = False
    hidden = []
    for blk in enc.blocks:
        hidden.append(x)
        a, h = blk.attn, blk.ln1(x)
        k, v = a.project_kv(h)
        o = F.scaled_dot_product_attention(a.split(a.q(h)), k, v, attn_mask=mask[:, None])
        x = x + a.out(o.transpose(1, 2).reshape(b, n, w))
        x = x + blk.mlp(blk.ln2(x))
    return model.expert.prefix_kv(hidden), valid, hidden


@pytest.mark.parametrize("expert_width", [0, 32], ids=["same-width", "narrow-expert"])
def test_the_shared_prefix_is_the_masked_full_sequence(expert_width):
    """Both branches' keys/values equal the masked whole-sequence prefix's (fp32, within 2e-6), and in that
    reference the observation's hidden states are the same in both branches: the indicator does not reach them."""
    cfg = dataclasses.replace(SMALL, expert_width=expert_width)
    model = build(cfg)
    imgs, state, tokens, _ = _obs(cfg)
    with torch.no_grad():
        kv, valid = model.cfg_prefix(imgs, state, tokens)
        want, want_valid, hidden = _masked_reference(
            model, [i.expand(2, -1, -1, -1) for i in imgs], state.expand(2, -1), tokens.expand(2, -1), model.cfg_adv
        )
    assert torch.equal(valid, want_valid)
    for (k, v), (wk, wv) in zip(kv, want):
        assert k.shape == wk.shape and (k - wk).abs().max() < 2e-6 and (v - wv).abs().max() < 2e-6
    for h in hidden[1:]:
        assert torch.equal(h[0, :-1], h[1, :-1]) and not torch.equal(h[0, -1], h[1, -1])


def test_fused_and_lean_keep_the_shared_layout_and_rows_match_batch_one():
    """fused is within float rounding of the plain model and lean its bytes on CPU (fp32 and bf16), at batch 1, over
    rows and in real-time chunking's guided sampling; each row of sample_rows is that observation's batch-1 chunk; the
    indicator still steers the chunk."""
    plain = build(SMALL)
    f, g = fuse(plain), lean(plain)
    imgs, state, tokens, noise = _obs(SMALL, 3, seed=1)
    one = [([i[j : j + 1] for i in imgs], state[j : j + 1], tokens[j : j + 1], noise[j : j + 1]) for j in range(3)]
    with torch.no_grad():
        rows = plain.sample_rows(imgs, state, tokens, noise)
        singles = torch.cat([plain.sample(*o) for o in one])
        assert (rows - singles).abs().max() < 1e-5
        assert (f.sample(*one[0]) - singles[:1]).abs().max() < 1e-5
        for ctx in (torch.autocast("cpu", enabled=False), torch.autocast("cpu", torch.bfloat16, cache_enabled=False)):
            with ctx:
                assert torch.equal(f.sample(*one[1]), g.sample(*one[1]))
                assert torch.equal(f.sample_rows(imgs, state, tokens, noise), g.sample_rows(imgs, state, tokens, noise))
        carried, w = torch.randn_like(noise[:1]), torch.zeros(1, SMALL.horizon, 1)
        w[:, :3] = 1.0
        rtc = guided_sample(plain, *one[0][:3], noise[:1], carried, w)
        assert (guided_sample(f, *one[0][:3], noise[:1], carried, w) - rtc).abs().max() < 1e-5
        assert torch.equal(f.guided_sample(*one[0][:3], noise[:1], carried, w), g.guided_sample(*one[0], carried, w))
        kv_c, valid = plain._prefix(*one[0][:3], torch.tensor([ADV_POSITIVE]))
        kv_u, _ = plain._prefix(*one[0][:3], torch.tensor([ADV_DROPPED]))
        x = torch.zeros_like(noise[:1])
        t = torch.ones(1)
        assert not torch.equal(plain.expert(x, t, kv_c, valid), plain.expert(x, t, kv_u, valid))


def test_shared_prefix_graphs_equal_their_eager_reference():
    """The captured CPU plan (jit, the capture guard in its warm-up) of the lean and plain shared-prefix samplers
    equals its own eager chunk byte for byte, at fp32 and bf16, on the 3b shape scaled down."""
    cfg = dataclasses.replace(
        size_config("3b"), width=64, expert_width=32, depth=2, heads=4, image_size=28, horizon=6, shared_prefix=True
    )
    plain = build(cfg)
    ins, outs = _buffers(cfg, "cpu")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    for model in (plain, lean(plain)):
        for precision in ("fp32", "bf16"):
            eager = _graph(model, ins, outs, "eager", precision)
            eager.replay()
            want = outs["actions"].clone()
            _graph(model, ins, outs, "jit", precision).replay()
            assert torch.equal(outs["actions"], want) and want.abs().max() > 0


def test_the_shared_prefix_trains():
    """The loss runs through the shared prefix at the training batch, gradients reach the indicator's embedding, and
    a few steps lower the loss on a fixed batch."""
    torch.manual_seed(0)
    model = build(SMALL).train()
    imgs, state, tokens, _ = _obs(SMALL, 8, seed=2)
    actions = torch.tanh(torch.randn(8, SMALL.horizon, SMALL.action_dim, generator=torch.Generator().manual_seed(3)))
    adv = torch.tensor([0, 1] * 4)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    losses = []
    for step in range(20):
        loss = model.loss(imgs, state, tokens, adv, actions, torch.Generator().manual_seed(step % 2))
        opt.zero_grad()
        loss.backward()
        assert model.adv_emb.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] and losses[-2] < losses[1]


def test_the_field_is_omitted_when_off_and_checked():
    """Old checkpoints keep their JSON (and fingerprint); the field shows when on, a config file can set it, and a
    non-bool is refused by name."""
    ckpt = json.loads(DEFAULT_CHECKPOINT.read_text())["config"]
    assert "shared_prefix" not in load_policy(DEFAULT_CHECKPOINT).cfg.to_json() and "shared_prefix" not in ckpt
    on = dataclasses.replace(SIZES["3b"], shared_prefix=True)
    assert on.to_json()["shared_prefix"] is True and FlowVLAConfig.from_json(on.to_json()) == on
    assert lean(build(SMALL)).cfg.to_json()["shared_prefix"] is True
    with pytest.raises(ValueError, match="shared_prefix"):
        FlowVLAConfig(shared_prefix=1)


@pytest.mark.parametrize("shared", [False, True])
def test_chunk_flops_counts_what_the_sampler_runs(shared):
    """chunk_flops' matmul count (its total less attention) is torch's FLOP counter's over one plain sample within
    0.5% (what it leaves out: the flow-time MLP and the state embedding); at 3b the shared prefix is 0.56x the chunk."""
    cfg = dataclasses.replace(SIZES["26m"], shared_prefix=shared)
    model = build(cfg)
    imgs, state, tokens, noise = _obs(cfg)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.sample(imgs, state, tokens, noise)
    est = chunk_flops(cfg)
    assert abs((est["total"] - est["attention"]) / counter.get_total_flops() - 1) < 0.005
    ratio = (
        chunk_flops(dataclasses.replace(SIZES["3b"], shared_prefix=True))["total"] / chunk_flops(SIZES["3b"])["total"]
    )
    assert 0.55 < ratio < 0.57


@pytest.mark.cuda
def test_shared_prefix_cuda_graphs_equal_their_eager():
    """On a GPU at bf16: the plain and lean shared-prefix CUDA graphs each equal their own eager chunk byte for byte."""
    cfg = dataclasses.replace(SIZES["26m"], shared_prefix=True)
    plain = build(cfg, "cuda")
    ins, outs = _buffers(cfg, "cuda")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    for model in (plain, lean(plain)):
        _graph(model, ins, outs, "eager", "bf16").replay()
        want = outs["actions"].clone()
        _graph(model, ins, outs, "cuda", "bf16").replay()
        assert torch.equal(outs["actions"], want) and want.abs().max() > 0


def test_roofline_arithmetic():
    """The bf16 roofline: each phase at the slower of its weight traffic and its peak-rate work. At 3b the guided
    prefix is compute-bound (5.70 ms of 989 TFLOP/s work against 1.5 ms of weights) and halves when shared; the
    expert is memory-bound (its weights' 2.27 ms) either way; on the shipped size both are microseconds."""
    today, shared = roofline_ms(SIZES["3b"]), roofline_ms(dataclasses.replace(SIZES["3b"], shared_prefix=True))
    assert today["prefix"] == pytest.approx(chunk_flops(SIZES["3b"])["prefix"] / 989e12 * 1e3)
    assert today["expert"] == pytest.approx(weight_floor(SIZES["3b"], "bf16", 3.35e12)["sampler_floor_ms"])
    assert 5.6 < today["prefix"] < 5.8 and 2.8 < shared["prefix"] < 2.9 and shared["expert"] == today["expert"]
    assert (
        today["chunk"] == pytest.approx(today["prefix"] + today["expert"])
        and roofline_ms(SIZES["shipped"])["chunk"] < 0.01
    )
