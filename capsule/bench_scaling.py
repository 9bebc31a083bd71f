"""Capsule restore and snapshot against a plain copy, for capsules from tens of KB to 256 MB.

Why: the default capsule (25.7 KB) is tiny; a real VLA's boundary state is
megabytes (several 224x224 cameras, a KV prefix). This measures how restore
and snapshot scale with size and what they cost beyond the copy itself.

The component is a real :class:`~rollcap.kernels.runner.GraphRunner` (eager
backend) whose buffers are shaped like a VLA's: float32 224x224x3 cameras
and proprio as inputs, a bfloat16 KV prefix ``[layers, 2, tokens, dim]`` and an
action chunk as outputs. Restore goes through the same path as the shipped
runners (capsule validation, then one batched copy into the checked buffers).

Each size is timed in interleaved rounds (copy floor, restore, restore
unbatched (each runner's own ``load_live_state``, the path before batching), snapshot,
clone floor), so a ratio is taken within one round; its spread over rounds
is reported (median, quartiles, min, max). Copies run on one intra-op thread.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from rollcap.capsule.bench import _floor_copy
from rollcap.capsule.verbs import restore, snapshot, validate
from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.runner import GraphRunner

MB = 1 << 20
DEFAULT_SIZES = (1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB)
"""Target capsule sizes (bytes); each is built as cameras + KV prefix, within a few KB."""
CAMERA = (224, 224, 3)
CAMERA_BYTES = 224 * 224 * 3 * 4
KV_LAYERS, KV_DIM = 18, 256
"""A PaliGemma-sized KV prefix: 18 layers, one KV head of 256 (pi0's VLM backbone)."""


def vla_specs(target_bytes: int) -> tuple[list[BufferSpec], list[BufferSpec]]:
    """Input and output buffers of a VLA-shaped state of about ``target_bytes``.

    Up to three float32 cameras (0.6 MB each, as many as fit in half the
    budget), proprio and the chunk's noise; the rest is a bfloat16 KV prefix
    ``[18 layers, 2 (K and V), tokens, 256]``.
    """
    cams = 0 if target_bytes < MB else min(3, max(1, (target_bytes // 2) // CAMERA_BYTES))
    ins = [BufferSpec(f"camera_{i}", CAMERA, torch.float32) for i in range(cams)]
    ins += [BufferSpec("proprio", (32,), torch.float32), BufferSpec("noise", (50, 7), torch.float32)]
    used = sum(s.nbytes for s in ins) + 50 * 7 * 4
    tokens = max(1, (target_bytes - used) // (KV_LAYERS * 2 * KV_DIM * 2))
    outs = [
        BufferSpec("kv_prefix", (KV_LAYERS, 2, tokens, KV_DIM), torch.bfloat16),
        BufferSpec("actions", (50, 7), torch.float32),
    ]
    return ins, outs


def vla_runner(target_bytes: int) -> GraphRunner:
    """An eager :class:`GraphRunner` over :func:`vla_specs` (its graph writes the noise into the actions)."""
    ins, outs = vla_specs(target_bytes)
    kv = torch.zeros(outs[0].shape, dtype=torch.bfloat16)

    def fn(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"kv_prefix": kv, "actions": inputs["noise"] * 1.0}

    runner = GraphRunner(fn, ins, outs, backend="eager", label=f"vla{target_bytes // MB}mb")
    gen = torch.Generator().manual_seed(0)
    for name, t in runner.live_state().items():  # non-zero bytes, so nothing is special-cased by the allocator
        t.copy_(torch.rand(t.shape, generator=gen).to(t.dtype))
    return runner


def _sample(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spread(xs: Sequence[float]) -> dict:
    """Median, quartiles and extremes: on a shared machine one preempted sample makes min/max meaningless."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": min(xs), "max": max(xs)}


def _restore_unbatched(cap, components: dict) -> None:
    """Restore as it was before runners were batched: validate, then each component's own ``load_live_state`` (which checks again)."""
    validate(cap, components)
    for name, comp in components.items():
        comp.load_live_state(dict(cap.state[name]))


def bench_size(components: dict, rounds: int) -> dict:
    """Interleaved rounds of copy floor / restore / snapshot / clone floor over ``components``."""
    live = [v for c in components.values() for v in c.live_state().values()]
    nbytes = sum(v.numel() * v.element_size() for v in live)
    floor = _floor_copy(live)
    cap = snapshot(components, "scaling")
    fns = {
        "copy": floor,
        "restore": lambda: restore(cap, components),
        "restore_unbatched": lambda: _restore_unbatched(cap, components),
        "snapshot": lambda: snapshot(components, "scaling"),
        "clone": lambda: [v.clone() for v in live],
    }
    for fn in fns.values():  # warm: page faults, caches
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(_sample(fn))
    ratio = lambda a, b: _spread([x / y for x, y in zip(times[a], times[b])])  # noqa: E731
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "bytes": nbytes,
        "buffers": len(live),
        "rounds": rounds,
        "seconds": {k: _spread(v) for k, v in times.items()},
        "restore_over_copy": ratio("restore", "copy"),
        "restore_unbatched_over_copy": ratio("restore_unbatched", "copy"),
        "snapshot_over_copy": ratio("snapshot", "copy"),
        "snapshot_over_clone": ratio("snapshot", "clone"),
        "restore_extra_us": (med["restore"] - med["copy"]) * 1e6,
        "snapshot_extra_us": (med["snapshot"] - med["clone"]) * 1e6,
        "copy_gbps": nbytes / med["copy"] / 1e9,
        "restore_gbps": nbytes / med["restore"] / 1e9,
    }


def _rounds(nbytes: int, quick: bool) -> int:
    if nbytes <= 2 * MB:
        return 50 if quick else 1000
    if nbytes <= 16 * MB:
        return 10 if quick else 60
    return 5 if quick else 15


def bench_scaling(
    default_components: dict | None = None, sizes: Sequence[int] = DEFAULT_SIZES, quick: bool = False
) -> dict:
    """Restore / snapshot vs copy at each size; ``default_components`` (the shipped runners) come first.

    Returns:
        JSON-able: ``rows`` (one per capsule, smallest first; see
        :func:`bench_size`) and ``fixed_cost_us`` (restore minus copy at the
        smallest capsule: the per-restore cost that does not scale).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread, as on a lane: on a shared machine a second one stalls copies for ms
    try:
        return _bench_scaling(default_components, sizes, quick)
    finally:
        torch.set_num_threads(threads)


def _bench_scaling(default_components: dict | None, sizes: Sequence[int], quick: bool) -> dict:
    rows = []
    if default_components is not None:
        rows.append({"capsule": "default policy + critic", **bench_size(default_components, _rounds(0, quick))})
    for size in sizes:
        runner = vla_runner(size)
        try:
            rows.append(
                {"capsule": f"VLA-shaped, {size / MB:g} MB", **bench_size({"vla": runner}, _rounds(size, quick))}
            )
        finally:
            runner.close()
            del runner
            gc.collect()
    return {
        "rows": rows,
        "fixed_cost_us": rows[0]["restore_extra_us"],
        "snapshot_fixed_cost_us": rows[0]["snapshot_extra_us"],
    }


def format_scaling(report: dict) -> list[str]:
    """One line per capsule: sizes, medians and ratios with their interquartile range over rounds."""
    out = []
    for r in report["rows"]:
        s, ro, so, sc = r["seconds"], r["restore_over_copy"], r["snapshot_over_copy"], r["snapshot_over_clone"]
        out.append(
            f"{r['bytes'] / 1e6:9.3f} MB  copy {s['copy']['median'] * 1e3:8.3f} ms  restore {s['restore']['median'] * 1e3:8.3f} ms "
            f"({ro['median']:.2f}x, IQR {ro['p25']:.2f}-{ro['p75']:.2f}; unbatched {r['restore_unbatched_over_copy']['median']:.2f}x)  snapshot {s['snapshot']['median'] * 1e3:8.3f} ms "
            f"({so['median']:.2f}x copy, {sc['median']:.2f}x clone)"
        )
    out.append(
        f"fixed cost per restore (restore - copy, smallest capsule): {report['fixed_cost_us']:.1f} us; snapshot - clone: {report['snapshot_fixed_cost_us']:.1f} us"
    )
    return out


def plot_scaling(report: dict, path: str | Path) -> Path:
    """Write a log-log plot of copy / restore / snapshot seconds against capsule bytes (needs matplotlib: the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("plotting needs matplotlib: pip install 'rollcap[plot]'") from err
    rows = report["rows"]
    x = np.array([r["bytes"] for r in rows], dtype=float)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key, style in (("copy", "k--"), ("clone", "k:"), ("restore", "C0o-"), ("snapshot", "C1s-")):
        med = np.array([r["seconds"][key]["median"] for r in rows]) * 1e3
        a.plot(x, med, style, label={"copy": "plain copy (floor)", "clone": "allocate + copy"}.get(key, key))
    a.set(xscale="log", yscale="log", xlabel="capsule bytes", ylabel="ms (median)", title="capsule restore / snapshot")
    a.legend()
    for key, color in (("restore_over_copy", "C0"), ("snapshot_over_clone", "C1")):
        med = np.array([r[key]["median"] for r in rows])
        lo, hi = np.array([r[key]["p25"] for r in rows]), np.array([r[key]["p75"] for r in rows])
        b.errorbar(x, med, yerr=[med - lo, hi - med], fmt="o-", color=color, capsize=3, label=key.replace("_", " "))
    b.axhline(1.2, color="grey", lw=0.8, ls="--", label="goal 1.2x")
    b.set(
        xscale="log",
        yscale="log",
        xlabel="capsule bytes",
        ylabel="ratio (median, IQR over rounds)",
        title="over the floor",
    )
    b.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
