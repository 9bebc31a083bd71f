"""The size sweep of ``rollcap bench --only models``: its JSON on CPU, and a bad ``--policy-size`` in one line."""

from __future__ import annotations

import json

import pytest

from rollcap.rollout.bench.model_sizes import SizeSweep, main


@pytest.mark.slow(seconds=15)
def test_sweep_on_cpu_writes_every_cell(tmp_path, capsys):
    """shipped, plain and fused, eager and jit: timings, ATen op counts, jit == its own eager, fused close to plain."""
    out = tmp_path / "sizes.json"
    assert main(["--device", "cpu", "--sizes", "shipped", "--reps", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    s = r["sizes"]["shipped"]
    assert s["params"] == 1_004_290 and "floor_ms" not in s and "roofline_ms" not in s  # no GPU figures on a CPU
    assert 0.25 < s["gflop"] < 0.35  # chunk_flops: 0.30 GFLOP a guided shipped chunk
    cells = {(c["variant"], c["backend"]): c for c in s["cells"]}
    assert set(cells) == {("plain", "eager"), ("plain", "jit"), ("fused", "eager"), ("fused", "jit")}
    for v in ("plain", "fused"):
        jit = cells[v, "jit"]
        assert jit["exact"] and jit["same_bytes"] and jit["graph_ms"] > 0 and jit["speedup"] > 0
    assert cells["fused", "eager"]["kernels"] < cells["plain", "eager"]["kernels"]  # fewer ATen ops per chunk
    assert 0 < s["fused_max_abs_diff_vs_plain"] < 1e-5
    assert set(s["fused_over_plain"]) == {"eager", "jit"} and s["fused_over_plain"]["jit"]["fused_over_plain"] > 0
    printed = capsys.readouterr().out
    assert "fused fp32 jit" in printed and "GFLOP a chunk" in printed


def test_bad_size_is_one_line(capsys):
    """An unknown size exits 2 with one line naming --policy-size and the nearest name; CPU defaults are the small sizes."""
    assert main(["--device", "cpu", "--sizes", "3B"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--policy-size: unknown size '3B'" in err and "'3b'" in err
    assert SizeSweep().resolved("cpu").sizes == ("shipped", "26m") and SizeSweep().resolved(
        "cpu", quick=True
    ).sizes == ("shipped",)
    assert SizeSweep().resolved("cpu").backends == ("jit",)


def test_a_size_that_fails_is_one_line_and_the_next_still_runs(monkeypatch):
    """A size that runs out of memory (say) is reported in one line; the sweep goes on to the next size."""
    from rollcap.rollout.bench import model_sizes

    def fake(name, sweep, device, emit=None):
        if name == "3b":
            raise RuntimeError("CUDA out of memory. Tried to allocate 11.3 GiB\nmore detail")
        return {"params": 1, "cells": []}

    monkeypatch.setattr(model_sizes, "bench_size", fake)
    r = model_sizes.bench_sizes("cpu", SizeSweep(sizes=("3b", "shipped")).resolved("cpu"))
    assert (
        r["sizes"]["3b"]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 11.3 GiB"
        and r["sizes"]["shipped"]["params"] == 1
    )
    rows = []
    model_sizes.format_sizes({"sizes": {"3b": r["sizes"]["3b"]}}, lambda name, val=None: rows.append((name, val)))
    assert rows == [("3b", "RuntimeError: CUDA out of memory. Tried to allocate 11.3 GiB")]
