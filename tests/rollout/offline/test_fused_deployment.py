"""The fused sampler as a deployment setting: ``--sampler fused`` runs, records, and replays/branches as recorded."""

from __future__ import annotations

import json

import pytest
import torch

from rollcap.policies.fused import fuse
from rollcap.policies.rtc import guided_sample
from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.runner import load_policy
from rollcap.rollout.spec import Parts
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.offline.deployment import recorded_parts
from rollcap.rollout.recording import iter_episodes
from tests.kernels._sampling import sampler_inputs
from tests.policies.test_fused import TOL
from tests.rollout.offline.test_deployment import PREFIX, UNSET, _digest, _rec, rollcap

UNSET_S = UNSET | {"sampler": None}


def test_fused_guided_rtc_sampling_equals_the_plain_one():
    """guided_sample on a fused model (the RTC runner's default sampler) is within TOL of the plain model's."""
    plain = load_policy(DEFAULT_CHECKPOINT)
    fused, cfg = fuse(plain), plain.cfg
    imgs, state, toks, noise = sampler_inputs(cfg, 3)
    w = torch.zeros(1, cfg.horizon, 1)
    w[:, :2] = 1.0
    carried = torch.randn(1, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = (
            guided_sample(plain, imgs, state, toks, noise, carried, w),
            guided_sample(fused, imgs, state, toks, noise, carried, w),
        )
        free = fused.sample(imgs, state, toks, noise)
    assert (a - b).abs().max() < TOL and (b - free).abs().max() > 1e-3  # close to plain's, and the guidance moved it


def test_fused_config_names_the_checkpoint_it_was_fused_from():
    """fuse(model, digest): the config JSON says variant fused and fused_from; without a digest, no fused_from."""
    plain = load_policy(PREFIX)
    assert fuse(plain, _digest(PREFIX)).cfg.to_json() == {
        **plain.cfg.to_json(),
        "variant": "fused",
        "fused_from": _digest(PREFIX),
    }
    assert "fused_from" not in fuse(plain).cfg.to_json()


def test_recorded_parts_takes_the_fused_sampler_back():
    """A fused recording: sampler fused, the checkpoint found by fused_from (its own weights_digest is the fused weights'), said once."""
    fp = {
        "device_kind": "cpu",
        "component": "policy",  # a captured runner's
        "weights_digest": "sha256:fused",
        "config": {"variant": "fused", "fused_from": _digest(PREFIX)},
    }
    parts, said = recorded_parts(dict(UNSET_S), _rec(fp), "r")
    assert parts["sampler"] == "fused" and parts["policy"] == PREFIX
    assert said == ["r: recorded with the fused sampler: replaying with it"]
    parts, said = recorded_parts(UNSET_S | {"sampler": "plain"}, _rec(fp), "r")  # the flag wins
    assert parts["sampler"] == "plain" and said == []
    parts, _ = recorded_parts(UNSET_S | {"policy": "expert"}, _rec(fp), "r")  # a named policy has no fused variant
    assert parts["sampler"] == "plain"
    parts, said = recorded_parts(
        dict(UNSET_S),
        _rec({"device_kind": "cpu", "component": "policy", "weights_digest": _digest(PREFIX), "config": {}}),
        "r",
    )
    assert parts["sampler"] == "plain" and said == []  # a plain recording says nothing


def test_fused_is_refused_for_named_policies():
    """lerobot:DIR and expert have no fused variant: a ConfigError naming sampler; an unknown sampler likewise."""
    with pytest.raises(
        ConfigError, match=r"^sampler: fused is a FlowVLA checkpoint's sampler; expert:0.1 has no fused variant"
    ):
        Parts(policy="expert:0.1", sampler="fused")
    with pytest.raises(ConfigError, match=r"^sampler: expected plain, fused, lean or sde, got 'fast'"):
        Parts(sampler="fast")
    res = rollcap(
        "run", "--policy", "expert", "--sampler", "fused", "--episodes", 1, "--no-progress", "--out", "/nonexistent/x"
    )
    assert (
        res.returncode == 2
        and len(res.stderr.strip().splitlines()) == 1
        and "--sampler: fused is a FlowVLA checkpoint's sampler" in res.stderr
    ), res.stderr


def _fp(out):
    return next(iter_episodes(out))[1].fingerprints["policy"]


@pytest.mark.slow(seconds=60)
def test_a_fused_run_records_and_replays_exact_with_no_flags(tmp_path):
    """--sampler fused: the fingerprint says so and differs from plain's; replay (all modes) and branch take it back, exact."""
    fused, plain = tmp_path / "fused", tmp_path / "plain"
    for out, extra in ((fused, ["--sampler", "fused"]), (plain, [])):
        res = rollcap(
            "run", "--episodes", 2, "--max-chunks", 3, "--no-progress", "--format", "npz", "--out", out, *extra
        )
        assert res.returncode == 0, res.stderr[-2000:]
    f, p = _fp(fused), _fp(plain)
    assert f["config"]["variant"] == "fused" and "variant" not in p["config"]
    assert f["config"]["fused_from"] == p["weights_digest"] == _digest(DEFAULT_CHECKPOINT) != f["weights_digest"]
    res = rollcap("replay", fused)
    assert res.returncode == 0 and "6 exact, 0 diverged, 0 not comparable, 0 failed" in res.stdout, (
        res.stdout + res.stderr[-2000:]
    )
    assert "recorded with the fused sampler: replaying with it" in res.stderr
    res = rollcap(
        "replay", fused, "--sampler", "plain", "--mode", "policy"
    )  # plain's chunks are close, not the recorded bits
    assert res.returncode == 1 and "2 not comparable" in res.stdout and "config.variant" in res.stdout, res.stdout
    res = rollcap("replay", plain, "--mode", "policy")  # the plain default path: unchanged, no word about a sampler
    assert res.returncode == 0 and "2 exact" in res.stdout and "sampler" not in res.stderr, res.stdout + res.stderr
    res = rollcap("branch", fused, "--episode", 0, "--chunk", 1, "--n", 2, "--out", tmp_path / "branch")
    assert res.returncode == 0 and "control: exact" in res.stdout, res.stdout + res.stderr[-2000:]


@pytest.mark.slow(seconds=90)
def test_fused_rtc_and_batched_runs_replay_exact(tmp_path):
    """The RTC runner (guided on the shipped policy, hard-prefix inpainting on the prefix checkpoint) and a batched run (--envs 2), fused: exact replays."""
    runs = {
        "rtc": ["--chunking", "rtc"],
        "prefix": ["--chunking", "rtc", "--policy", PREFIX, "--critic", "none"],
        "batch": ["--envs", 2, "--episodes", 2],
    }
    for name, extra in runs.items():
        out = tmp_path / name
        res = rollcap(
            "run",
            "--episodes",
            1,
            "--max-chunks",
            3,
            "--sampler",
            "fused",
            "--no-progress",
            "--format",
            "npz",
            "--out",
            out,
            *extra,
        )
        assert res.returncode == 0, name + res.stderr[-2000:]
        fp = _fp(out)
        assert fp["config"]["variant"] == "fused", name
        assert fp.get("rtc_sampler") == {"rtc": "identity", "prefix": "prefix"}.get(name) and fp.get("batch", 1) == (
            2 if name == "batch" else 1
        ), json.dumps(fp)[:500]
        res = rollcap("replay", out)
        assert res.returncode == 0 and "0 diverged, 0 not comparable, 0 failed -- all exact" in res.stdout, (
            name + res.stdout + res.stderr[-2000:]
        )
