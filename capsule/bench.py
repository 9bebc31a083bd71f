"""Capsule timings: snapshot and restore per tier against a plain copy of the same bytes.

``bench_capsules`` is wired into ``rollcap bench`` by the rollout layer. It
restores each capsule it takes into the same components, so their live
state is the same before and after.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from rollcap.capsule.protocol import Stateful
from rollcap.capsule.disk import save
from rollcap.capsule.verbs import restore, snapshot


def _sync(devices: set[torch.device]) -> None:
    for dev in devices:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)


def _median_s(fn: Callable[[], object], repeats: int, devices: set[torch.device]) -> float:
    fn()  # warm: allocator, page faults
    times = []
    for _ in range(repeats):
        _sync(devices)
        t0 = time.perf_counter()
        fn()
        _sync(devices)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _floor_copy(live: list) -> Callable[[], None]:
    """The same bytes copied with one ``torch._foreach_copy_`` per device (``np.copyto`` for numpy)."""
    groups: dict[torch.device, tuple[list, list]] = {}
    arrays = []
    for v in live:
        if isinstance(v, np.ndarray):
            arrays.append((np.empty_like(v), v))
        else:
            dsts, srcs = groups.setdefault(v.device, ([], []))
            dsts.append(torch.empty_like(v))
            srcs.append(v.detach())

    def run() -> None:
        for dsts, srcs in groups.values():
            torch._foreach_copy_(dsts, srcs)
        for dst, src in arrays:
            np.copyto(dst, src)

    return run


def bench_capsules(components: Mapping[str, Stateful], repeats: int = 5) -> dict:
    """Median snapshot and restore seconds per tier, and the plain-copy floor.

    Args:
        components: name -> live component (left as it was).
        repeats: timed repetitions per measurement (after one warm-up).

    Returns:
        JSON-able: ``bytes``, ``buffers``, ``components``, ``devices``,
        ``repeats``, ``floor_copy_s`` (copy into preallocated memory: the
        restore floor), ``floor_clone_s`` (allocate + copy: the snapshot
        floor) and ``tiers`` -> ``device``/``host``/``disk``
        -> ``snapshot_s``, ``restore_s``, ``snapshot_gbps``, ``restore_gbps``,
        ``snapshot_over_floor``, ``restore_over_floor`` (both against
        ``floor_copy_s``). Disk snapshot includes
        the digest, the write and the fsyncs; disk restore includes reading and
        verifying every digest.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    live = [v for c in components.values() for v in c.live_state().values()]
    devices = {v.device for v in live if isinstance(v, torch.Tensor)}
    nbytes = sum(int(v.nbytes) if isinstance(v, np.ndarray) else v.numel() * v.element_size() for v in live)
    floor = _median_s(_floor_copy(live), repeats, devices)
    clone_floor = _median_s(
        lambda: [v.copy() if isinstance(v, np.ndarray) else v.clone() for v in live], repeats, devices
    )

    def entry(snap_s: float, rest_s: float) -> dict:
        gbps = lambda s: nbytes / s / 1e9 if s > 0 else None  # noqa: E731
        over = lambda s: s / floor if floor > 0 else None  # noqa: E731
        return {
            "snapshot_s": snap_s,
            "restore_s": rest_s,
            "snapshot_gbps": gbps(snap_s),
            "restore_gbps": gbps(rest_s),
            "snapshot_over_floor": over(snap_s),
            "restore_over_floor": over(rest_s),
        }

    tiers = {}
    for tier in ("device", "host"):
        cap = snapshot(components, "bench", tier=tier)
        tiers[tier] = entry(
            _median_s(lambda: snapshot(components, "bench", tier=tier), repeats, devices),
            _median_s(lambda: restore(cap, components), repeats, devices),
        )
    with tempfile.TemporaryDirectory(prefix="rollcap-bench-") as tmp:
        counter = iter(range(10**9))
        on_disk = save(snapshot(components, "bench", tier="host"), Path(tmp) / "restore")
        tiers["disk"] = entry(
            _median_s(
                lambda: save(snapshot(components, "bench", tier="host"), Path(tmp) / f"c{next(counter)}"),
                repeats,
                devices,
            ),
            _median_s(lambda: restore(on_disk, components), repeats, devices),
        )
    return {
        "bytes": nbytes,
        "buffers": len(live),
        "components": list(components),
        "devices": sorted(str(d) for d in devices)
        + (["numpy"] if any(isinstance(v, np.ndarray) for v in live) else []),
        "repeats": repeats,
        "floor_copy_s": floor,
        "floor_clone_s": clone_floor,
        "tiers": tiers,
    }
