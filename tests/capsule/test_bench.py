"""bench_capsules: JSON-able timings per tier against the plain-copy floor."""

from __future__ import annotations

import json

import _capsule_components as comps
import pytest

from rollcap.capsule import bench_capsules


def test_bench_reports_every_tier_and_leaves_state(eager_world):
    """One repeat: every tier has snapshot/restore medians, bytes match, live state is unchanged."""
    before = comps.state_bytes(eager_world)
    report = bench_capsules(eager_world, repeats=1)
    json.dumps(report)
    assert comps.state_bytes(eager_world) == before
    assert report["bytes"] == sum(len(raw) for bufs in before.values() for _, _, raw in bufs.values())
    assert (
        report["buffers"] == 14
        and report["devices"] == ["cpu", "numpy"]
        and report["floor_copy_s"] > 0
        and report["floor_clone_s"] > 0
    )
    assert set(report["tiers"]) == {"device", "host", "disk"}
    for entry in report["tiers"].values():
        assert set(entry) == {
            "snapshot_s",
            "restore_s",
            "snapshot_gbps",
            "restore_gbps",
            "snapshot_over_floor",
            "restore_over_floor",
        }
        assert entry["snapshot_s"] > 0 and entry["restore_s"] > 0
    with pytest.raises(ValueError, match="repeats"):
        bench_capsules(eager_world, repeats=0)
