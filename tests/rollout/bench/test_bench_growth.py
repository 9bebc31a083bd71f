"""bench_growth: per-append figures around the marks, and peak RSS of a fresh process."""

from __future__ import annotations

import json

import pytest

from rollcap.rollout.bench.growth import h5_append_growth, main, peak_rss_mb
from rollcap.rollout.recording import iter_any


def test_h5_append_growth_reports_each_mark(tmp_path):
    """12 appends: rows at episode 1 (the first ten appends), journaled pages counted, the copies readable."""
    report = h5_append_growth(12, tmp_path, copies_at=(10,))
    json.dumps(report)
    (row,) = report["rows"]
    assert row["episode"] == 1 and row["append_ms_min"] <= row["append_ms"] <= row["append_ms_max"]
    assert row["append_cpu_ms"] > 0 and row["journaled_pages"] > 0
    assert set(report["files"]) == {"10", "12"}
    assert [r.index for r in iter_any(report["files"]["10"])] == list(range(10))


def test_peak_rss_of_a_fresh_process():
    """A process that allocates 200 MB peaks above one that allocates nothing; a failing one raises."""
    idle = peak_rss_mb("pass")
    big = peak_rss_mb("b = bytearray(200 * 2**20)")
    assert big > idle + 150
    with pytest.raises(RuntimeError, match="reader failed"):
        peak_rss_mb("raise SystemExit(3)")


def test_growth_cli_refuses_a_tiny_run():
    """--episodes below 10 (other than 0) is a one-line usage error."""
    with pytest.raises(SystemExit) as err:
        main(["--episodes", "5"])
    assert err.value.code == 2
