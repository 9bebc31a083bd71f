"""Capsule scaling bench and the one-pass restore path it measures (VLA-shaped GraphRunner state)."""

from __future__ import annotations

import json

import pytest
import torch

from rollcap.capsule import CapsuleMismatch, restore, snapshot
from rollcap.capsule.bench_scaling import MB, bench_scaling, format_scaling, plot_scaling, vla_runner, vla_specs
from rollcap.kernels.errors import BadInput


@pytest.mark.parametrize("target", [MB, 4 * MB, 16 * MB])
def test_vla_specs_hit_their_size(target):
    """Cameras + KV prefix come within 3% of the asked size, with at least one 224x224 camera from 1 MB up."""
    ins, outs = vla_specs(target)
    total = sum(s.nbytes for s in ins + outs)
    assert abs(total - target) / target < 0.03
    assert any(s.shape == (224, 224, 3) for s in ins)
    assert outs[0].dtype == torch.bfloat16 and outs[0].shape[:2] == (18, 2)


def test_restore_one_pass_copies_every_buffer_back():
    """A changed VLA-shaped runner gets every byte back from its capsule; nothing is rebound."""
    runner = vla_runner(MB)
    try:
        comps = {"vla": runner}
        before = {k: v.clone() for k, v in runner.live_state().items()}
        ptrs = {k: v.data_ptr() for k, v in runner.live_state().items()}
        cap = snapshot(comps, "s")
        for v in runner.live_state().values():
            v.fill_(3)
        restore(cap, comps)
        after = runner.live_state()
        assert all(torch.equal(after[k], before[k]) for k in before)
        assert {k: v.data_ptr() for k, v in after.items()} == ptrs
    finally:
        runner.close()


def test_runner_load_refuses_a_bad_value_before_any_copy():
    """load_live_state with one wrong-dtype value takes the checked path: refused, no buffer written."""
    runner = vla_runner(MB)
    try:
        state = {k: v.clone() + 1 for k, v in runner.live_state().items()}
        state["in.proprio"] = state["in.proprio"].double()
        before = {k: v.clone() for k, v in runner.live_state().items()}
        with pytest.raises(BadInput, match="proprio"):
            runner.load_live_state(state)
        assert all(torch.equal(runner.live_state()[k], before[k]) for k in before)
    finally:
        runner.close()


def test_restore_into_another_shape_is_refused():
    """A capsule of a 1 MB runner does not restore into a 4 MB one (the fast check fails, the full one names the buffer)."""
    small, big = vla_runner(MB), vla_runner(4 * MB)
    try:
        cap = snapshot({"vla": small}, "s")
        with pytest.raises(CapsuleMismatch, match="vla"):
            restore(cap, {"vla": big})
    finally:
        small.close()
        big.close()


@pytest.mark.slow
def test_bench_scaling_reports_ratios_with_spread(tmp_path):
    """One small size: JSON-able rows with median/min/max ratios, a fixed cost, a table and a plot."""
    report = bench_scaling(None, sizes=(MB,), quick=True)
    json.dumps(report)
    (row,) = report["rows"]
    assert row["bytes"] == pytest.approx(MB, rel=0.03) and row["rounds"] >= 5
    for key in ("restore_over_copy", "snapshot_over_copy", "snapshot_over_clone"):
        assert row[key]["min"] <= row[key]["p25"] <= row[key]["median"] <= row[key]["p75"] <= row[key]["max"]
    assert "fixed cost" in format_scaling(report)[-1]
    pytest.importorskip("matplotlib")
    assert plot_scaling(report, tmp_path / "s.png").stat().st_size > 0
