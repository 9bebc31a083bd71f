"""Named FlowVLA sizes: built on ``meta`` (nothing allocated), their parameter counts, the floor arithmetic, lookups."""

from __future__ import annotations

import json

import pytest
import torch

from rollcap.policies import FlowVLAConfig
from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.runner import load_policy
from rollcap.policies.sizes import HBM_BYTES_PER_S, SIZES, build, param_counts, size_config, weight_floor
from tests.helpers import TINY_POLICY

# Counted once on meta and pinned: a change to the architecture or a size shows here.
PARAMS = {"shipped": 1_004_290, "26m": 26_467_330, "205m": 204_627_970, "300m": 306_077_710, "3b": 2_838_221_326}


@pytest.mark.parametrize("name", list(SIZES))
def test_size_builds_on_meta_with_its_parameter_count(name):
    """Every named size builds on the meta device (no storage) with the pinned parameter count."""
    model = build(SIZES[name], "meta")
    assert all(p.is_meta for p in model.parameters())
    counts = param_counts(model)
    assert counts["total"] == PARAMS[name]
    assert 0 < counts["expert_step"] < counts["total"]


def test_sizes_span_the_shipped_policy_to_pi0_scale():
    """shipped == the shipped checkpoint's shape; the pi0-shaped sizes: 2 cameras, 50 actions, 10 steps, ~0.3 B and ~3 B."""
    assert SIZES["shipped"] == load_policy(DEFAULT_CHECKPOINT).cfg
    assert sum(p.numel() for p in load_policy(DEFAULT_CHECKPOINT).parameters()) == PARAMS["shipped"]
    for name, lo, hi in (("300m", 2.5e8, 3.5e8), ("3b", 2.5e9, 3.5e9)):
        cfg = SIZES[name]
        assert lo < PARAMS[name] < hi
        assert (len(cfg.image_keys), cfg.horizon, cfg.num_steps) == (2, 50, 10)
    assert SIZES["3b"].expert_width == 1024 < SIZES["3b"].width


def test_weight_floor_arithmetic():
    """Floor = (prefix bytes + K x expert-step bytes) / bandwidth; 205m in bf16 on an H200 ~0.5 ms (issue 33's figure)."""
    cfg = SIZES["205m"]
    f = weight_floor(cfg, "bf16", HBM_BYTES_PER_S["H200"])
    c = param_counts(build(cfg, "meta"))
    assert f["bytes_per_chunk"] == 2 * (c["prefix"] + cfg.num_steps * c["expert_step"])
    assert f["chunk_floor_ms"] == pytest.approx(f["bytes_per_chunk"] / 4.8e12 * 1e3)
    assert 0.18e9 < f["bytes_per_step"] < 0.22e9 and 0.4 < f["chunk_floor_ms"] < 0.6
    assert weight_floor(cfg, "fp32", HBM_BYTES_PER_S["H100 SXM"])["chunk_floor_ms"] == pytest.approx(
        f["chunk_floor_ms"] * 2 * 4.8 / 3.35
    )


def test_size_lookup_suggests_and_reads_config_files(tmp_path):
    """An unknown name is one line with the nearest one; a config or checkpoint .json is read; a bad file names it."""
    with pytest.raises(ValueError, match=r"--policy-size: unknown size '26M'.*did you mean '26m'"):
        size_config("26M")
    assert size_config(str(DEFAULT_CHECKPOINT)) == SIZES["shipped"]
    p = tmp_path / "mine.json"
    p.write_text(json.dumps(TINY_POLICY.to_json()))
    assert size_config(str(p)) == TINY_POLICY
    p.write_text(json.dumps({**TINY_POLICY.to_json(), "depth": 0}))
    with pytest.raises(ValueError, match=r"--policy-size .*mine.json.*depth"):
        size_config(str(p))
    with pytest.raises(ValueError, match="--policy-size: cannot read"):
        size_config(str(tmp_path / "absent.json"))


def test_new_config_fields_keep_old_checkpoints_and_are_checked():
    """expert_width and mlp_ratio are omitted from the JSON at their defaults (checkpoint fingerprints unchanged) and validated by name."""
    ckpt = json.loads(DEFAULT_CHECKPOINT.read_text())["config"]
    assert load_policy(DEFAULT_CHECKPOINT).cfg.to_json() == ckpt
    assert SIZES["3b"].to_json()["expert_width"] == 1024 and SIZES["3b"].to_json()["mlp_ratio"] == 8
    with pytest.raises(ValueError, match="expert_width"):
        FlowVLAConfig(width=32, heads=2, expert_width=15)
    with pytest.raises(ValueError, match="mlp_ratio"):
        FlowVLAConfig(mlp_ratio=0)


def test_narrow_expert_samples():
    """A model whose expert is narrower than its prefix projects the prefix's keys/values itself and samples finite actions."""
    import dataclasses

    cfg = dataclasses.replace(TINY_POLICY, expert_width=16, mlp_ratio=3)
    model = build(cfg, "cpu")
    assert model.expert.prefix_proj[0].weight.shape == (32, 32)
    imgs = [torch.zeros(1, 32, 32, 3, dtype=torch.uint8)]
    with torch.no_grad():
        out = model.sample(imgs, torch.zeros(1, 5), torch.full((1, 32), 256), torch.randn(1, 4, 2))
    assert out.shape == (1, 4, 2) and torch.isfinite(out).all()
