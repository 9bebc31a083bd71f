"""The issue-42 side-by-side (python -m rollcap.rollout.bench.kernel_sweep) as its CPU dry run does it."""

from __future__ import annotations

import json

import pytest

from rollcap.policies.sizes import SIZES
from rollcap.rollout.bench.kernel_sweep import main


def test_cpu_dry_run_times_today_and_lean_and_refuses_fp8_in_its_row(tmp_path, capsys):
    out = tmp_path / "k.json"
    settings = "fused-bf16,lean-bf16,lean-fp8,lean-bf16-shared,lean-bf16-shared-attn,lean-bf16-step"
    assert main(["--device", "cpu", "--reps", "1", "--settings", settings, "--json", str(out)]) == 0
    size = json.loads(out.read_text())["sizes"]["shipped"]
    s = size["settings"]
    assert s["fused-bf16"]["exact"] and s["lean-bf16"]["exact"] and s["lean-bf16"]["max_abs_diff_vs_today"] == 0.0
    assert s["lean-bf16"]["backend"] == "jit" and "GEMM" in s["lean-bf16"]["profile"]["categories"]
    assert s["lean-fp8"]["error"].endswith("has none: use bf16") and "chunk_ms" not in s["lean-fp8"]
    # the shared prefix: its own model (same weights, another network), exact to its own eager, fewer FLOPs
    assert s["lean-bf16-shared"]["exact"] and s["lean-bf16-shared"]["max_abs_diff_vs_today"] > 0
    assert size["gflop"]["shared"] < 0.8 * size["gflop"]["today"]
    # the attention kernel's setting: its own model, built with the kernel; on CPU the reference runs, the same chunk
    assert s["lean-bf16-shared-attn"]["sampler"] == "lean-attn" and s["lean-bf16-shared-attn"]["exact"]
    assert s["lean-bf16-shared-attn"]["max_abs_diff_vs_today"] == s["lean-bf16-shared"]["max_abs_diff_vs_today"]
    # the step kernel's setting: the shipped expert fits it; on CPU the lean step runs, the same chunk
    assert s["lean-bf16-step"]["sampler"] == "lean-step" and s["lean-bf16-step"]["exact"]
    assert s["lean-bf16-step"]["max_abs_diff_vs_today"] == 0.0
    printed = capsys.readouterr().out
    assert "| category | fused-bf16 | lean-bf16 | lean-bf16-shared |" in printed and "(another model)" in printed
    # the prefix and the expert's steps apart: the shared prefix changes the prefix, not the steps
    ph = {k: s[k]["phases"] for k in ("lean-bf16", "lean-bf16-shared")}
    assert all(p["prefix"]["kernels"] and p["steps"]["kernels"] for p in ph.values())
    assert ph["lean-bf16-shared"]["steps"]["kernels"] == ph["lean-bf16"]["steps"]["kernels"]
    assert "| **steps** |" in printed and "by phase (ATen ops" in printed
    assert main(["--device", "cpu", "--settings", "fp4"]) == 2
    # an expert too wide for the step kernel: its setting says why, and nothing is built or timed for it
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps({**SIZES["26m"].to_json(), "depth": 1, "image_size": 16}))
    args = ["--device", "cpu", "--reps", "1", "--sizes", str(wide), "--settings", "lean-bf16-step"]
    assert main([*args, "--json", str(out)]) == 0
    s = json.loads(out.read_text())["sizes"][str(wide)]["settings"]
    assert s["lean-bf16-step"] == {
        "sampler": "lean-step",
        "precision": "bf16",
        "backend": "jit",
        "error": "not taken: expert width 512: the step kernel takes a power of two from 16 to 256",
    }


@pytest.mark.parametrize("device, why", [("nope", "is not a device"), ("cuda:99", "is not available here")])
def test_a_device_this_machine_lacks_is_one_line(device, why, capsys):
    """The size benches refuse a malformed or absent --device in one line, exit 2, before building anything."""
    from rollcap.rollout.bench import model_sizes

    for entry in (main, model_sizes.main):
        assert entry(["--device", device, "--sizes", "shipped"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --device: '{device}' {why}"), err
