"""Bench sections ``capsule`` (snapshot / restore per tier vs a plain copy; restore vs rebuild-and-recapture) and ``scaling`` (capsule sizes from 25 KB to 256 MB, :mod:`rollcap.capsule.bench_scaling`)."""

from __future__ import annotations

from rollcap.kernels.graph import capture_count
from rollcap.rollout.bench.timing import stats, time_calls
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_runners


def bench_capsule(parts: Parts, n: int) -> dict:
    from rollcap.capsule.bench import bench_capsules
    from rollcap.capsule.verbs import restore, snapshot

    policy, critic = make_runners(parts)
    comps = {"policy": policy, "critic": critic}
    out = bench_capsules(comps, repeats=n)
    cap = snapshot(comps, label="bench")
    t_restore = time_calls(lambda: restore(cap, comps), n)
    before = capture_count()

    def rebuild():
        p, c = make_runners(parts)
        p.close()
        c.close()

    t_rebuild = time_calls(rebuild, max(2, n // 20), warm=0)
    out["restore_device_ms"] = stats(t_restore)["median_ms"]
    out["rebuild_and_recapture_ms"] = stats(t_rebuild)["median_ms"]
    out["restore_vs_rebuild_speedup"] = out["rebuild_and_recapture_ms"] / out["restore_device_ms"]
    out["recaptures_during_rebuild"] = capture_count() - before
    return out


def bench_scaling(parts: Parts, n: int) -> dict:
    """Capsule restore / snapshot vs a plain copy: the shipped runners' capsule, then VLA-shaped ones up to 256 MB (4 MB with --quick)."""
    from rollcap.capsule.bench_scaling import DEFAULT_SIZES, MB, bench_scaling as _scaling

    policy, critic = make_runners(parts)
    try:
        quick = n < 100
        return _scaling(
            {"policy": policy, "critic": critic},
            [s for s in DEFAULT_SIZES if s <= 4 * MB] if quick else DEFAULT_SIZES,
            quick=quick,
        )
    finally:
        policy.close()
        critic.close()


def format_capsule(c: dict, row) -> None:
    """The section's rows of the human table."""
    row("plain copy of the same bytes (floor)", f"{c['floor_copy_s'] * 1e3:.4f} ms")
    for tier, t in c["tiers"].items():
        row(
            f"{tier}: snapshot / restore",
            f"{t['snapshot_s'] * 1e3:.4f} / {t['restore_s'] * 1e3:.4f} ms (restore {t['restore_over_floor']:.1f}x floor)",
        )
    row(
        "restore vs rebuild-and-recapture",
        f"{c['restore_device_ms']:.4f} vs {c['rebuild_and_recapture_ms']:.1f} ms ({c['restore_vs_rebuild_speedup']:.0f}x)",
    )


def format_scaling(s: dict, row) -> None:
    """The ``scaling`` section's lines (:func:`rollcap.capsule.bench_scaling.format_scaling`)."""
    from rollcap.capsule.bench_scaling import format_scaling as lines

    for line in lines(s):
        row(line)
