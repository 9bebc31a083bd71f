"""``rollcap bench --only recording``: what the writer thread spends per episode, stage by stage.

Why: recording with images cost 13-20% of rollout wall on this 2-core
machine, and image compression was the suspect. This times each stage of
writing real episodes of the shipped task (wall and the writing thread's CPU
time), the compression of the image frames on its own (what the npz deflate
and the HDF5 gzip filter do to them), and the background writer's overhead
against an unrecorded rollout of the same episodes, in interleaved rounds.
On two cores the writer's CPU time, not its wall (fsyncs wait on the disk),
is what it takes from the lanes and the host.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from rollcap.rollout.bench.timing import cost_text, spread
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners


def _timed(fn) -> tuple[float, float]:
    """(wall s, this thread's CPU s) of ``fn()``."""
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w0, time.thread_time() - c0


def bench_recording(parts: Parts, n: int) -> dict:
    """Per-stage writer cost per episode, as a share of the unrecorded rollout's wall, and the background overhead.

    Returns:
        JSON-able: ``episodes``, ``rollout_ms`` (wall per episode, unrecorded),
        ``image_bytes`` per episode, ``stages`` -> name -> ``wall_ms`` /
        ``cpu_ms`` per episode and ``cpu_share`` (CPU over rollout wall), and
        ``background_overhead`` / ``sync_overhead`` (median, min, max over rounds).
    """
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.recording import deflate
    from rollcap.rollout.recording.codec import checked_meta, is_image
    from rollcap.rollout.recording.h5 import H5Writer
    from rollcap.rollout.recording.npz import write_npz
    from rollcap.rollout.subscribers import InBackground

    quick = n < 100
    episodes, rounds = (3, 3) if quick else (10, 3)  # a range over rounds needs three; an episode is ~0.1-0.3 s here
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    env_meta = {"env_name": parts.env_id, "type": 2, "env_kwargs": dict(parts.env_kwargs or {})}
    walls: dict[str, list[float]] = {"plain": [], "background": [], "sync": []}
    with tempfile.TemporaryDirectory(prefix="rollcap-recbench-") as tmp:
        for r in range(rounds):  # interleaved, so drift on a shared machine hits each mode alike
            for mode in walls:
                rec = EpisodeRecorder(Path(tmp) / f"{mode}{r}", formats=("npz", "h5"), env_meta=env_meta)
                subs = {"plain": [], "background": [InBackground(rec)], "sync": [rec]}[mode]
                host = RolloutHost(env, policy, critic, HostConfig(seed=11), subs, records=True)
                t0 = time.perf_counter()
                ends = host.run(episodes)
                walls[mode].append(time.perf_counter() - t0)
                rec.close()
        records = [e.record for e in ends if e.record is not None]
        stage_s: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (in the order first timed)
        h5 = H5Writer(Path(tmp) / "stages.hdf5", env_meta)
        for rec in records:
            images = [a for a in rec.obs.values() if is_image(a)]
            checked = checked_meta(rec)  # as the recorder does: once for both formats
            stage_s["checks + digests (once)"].append(_timed(lambda: checked_meta(rec)))
            stage_s["npz write (whole)"].append(
                _timed(lambda: write_npz(rec, Path(tmp) / f"stage_{rec.index}.npz", checked))
            )
            stage_s["h5 append (whole)"].append(_timed(lambda: h5.append(rec, checked)))
            stage_s["image gzip-4 per frame, zlib (h5's before issue 57)"].append(
                _timed(lambda: [zlib.compress(f.tobytes(), 4) for a in images for f in a])
            )
            stage_s["image deflate-1 per frame, zlib (both formats', once, until this round)"].append(
                _timed(lambda: [zlib.compress(f.tobytes(), 1) for a in images for f in a])
            )
            copies = [a.copy() for a in images]  # new arrays: nothing the writes above compressed is reused
            stage_s[f"image deflate-1 in ~128 KiB chunks, {deflate.ENGINE} (the writer's now)"].append(
                _timed(lambda: [deflate.frames(a) for a in copies])
            )
        producer = _producer(records, Path(tmp), env_meta, quick)
        writer = writer_cpu(records, Path(tmp) / "writer", env_meta, rounds=1 if quick else 3)
    for part in (policy, critic, env):
        if part is not None:  # --critic none
            part.close()
    plain = statistics.median(walls["plain"]) / episodes
    stages = {}
    for name, samples in stage_s.items():
        wall = statistics.mean(w for w, _ in samples)
        cpu = statistics.mean(c for _, c in samples)
        stages[name] = {"wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3, "cpu_share": cpu / plain}
    stages_cpu = sum(stages[k]["cpu_ms"] for k in ("checks + digests (once)", "npz write (whole)", "h5 append (whole)"))
    return {
        "episodes": episodes,
        "rounds": rounds,
        "rollout_ms": plain * 1e3,
        "steps_per_episode": float(np.mean([r.num_steps for r in records])),
        "image_bytes": float(np.mean([sum(a.nbytes for a in r.obs.values() if is_image(a)) for r in records])),
        "stages": stages,
        "writer_cpu_share": stages_cpu / 1e3 / plain,
        "background_overhead": spread([b / p - 1 for b, p in zip(walls["background"], walls["plain"])]),
        "sync_overhead": spread([s / p - 1 for s, p in zip(walls["sync"], walls["plain"])]),
        "producer": producer,
        "writer": writer,
        "deflate": deflate.ENGINE,
    }


WRITER_CASES = (("npz",), ("h5",), ("npz", "h5"))
PER_COMMIT = (1, 16)
"""Episodes a commit in :func:`writer_cpu`: one (a writer that keeps up, before issue 57 the workers' and the host
thread's usual case) and 16 (what a writer gathering for :data:`~rollcap.rollout.subscribers.GATHER_S` commits at
~60 episodes/s)."""


def writer_cpu(records, tmp: Path, env_meta: dict, rounds: int = 3) -> dict:
    """The writer's CPU per episode (``EpisodeRecorder.write_many``: checks, digests, compression, both containers,
    the HDF5 commit), per format and per commit size, on fresh copies of ``records`` (nothing cached from an earlier
    write), interleaved over ``rounds``; median and range in ms."""
    import copy

    from rollcap.rollout.recording import EpisodeRecorder

    out: dict = {}
    for r in range(rounds):
        for formats in WRITER_CASES:
            for per in PER_COMMIT:
                fresh = [copy.deepcopy(rec) for rec in records]  # new arrays: the frames' encodings are not reused
                rec = EpisodeRecorder(tmp / f"{'+'.join(formats)}-{per}-{r}", formats, env_meta)
                c0 = time.thread_time()
                for k in range(0, len(fresh), per):
                    rec.write_many(fresh[k : k + per])
                out.setdefault(f"{'+'.join(formats)}, {per} a commit", []).append(
                    1e3 * (time.thread_time() - c0) / len(fresh)
                )
                rec.close()
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)} for k, v in out.items()}


RATE, WORK_MS = 50.0, 8.0
"""The synthetic producer's episodes per second and the host's own GIL-held work per episode (see :mod:`~rollcap.rollout.bench.producer`)."""


def _producer(records, tmp: Path, env_meta: dict, quick: bool) -> dict:
    """The background writer (a thread, both formats) fed these episodes at :data:`RATE` per second."""
    from rollcap.rollout.bench.producer import CpuOf, compare
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.recording.process import WriterPool, WriterProcess
    from rollcap.rollout.subscribers import InBackground

    def thread(r: int):
        meter = CpuOf(EpisodeRecorder(tmp / f"producer-thread{r}", formats=("npz", "h5"), env_meta=env_meta))
        return InBackground(meter), meter

    def process(r: int):
        return WriterProcess(tmp / f"producer-process{r}", formats=("npz", "h5"), env_meta=env_meta), None

    def pool(r: int):
        return WriterPool(tmp / f"producer-pool{r}", writers=2, formats=("npz", "h5"), env_meta=env_meta), None

    episodes, rounds = (20, 2) if quick else (100, 3)
    return compare(
        records, {"thread": thread, "process": process, "2 processes": pool}, episodes, RATE, WORK_MS, rounds
    )


def format_recording(r: dict, row) -> None:
    """Rows for the human table (``row(name, value)``)."""
    row(
        "rollout, unrecorded (wall per episode)",
        f"{r['rollout_ms']:.1f} ms ({r['steps_per_episode']:.0f} steps, {r['image_bytes'] / 1e3:.0f} KB of image frames)",
    )
    for name, s in r["stages"].items():
        row(f"  {name}", f"wall {s['wall_ms']:.2f} ms, CPU {s['cpu_ms']:.2f} ms ({s['cpu_share']:.1%} of rollout wall)")
    row("writer CPU (checks + npz + h5) / rollout wall", f"{r['writer_cpu_share']:.1%}")
    for key in ("background_overhead", "sync_overhead"):
        row(f"{key.replace('_', ' ')} ({r['episodes']} episodes a round)", cost_text(r[key], r.get("load")))
    w = r.get("writer")
    if w is not None:
        row(
            f"writer CPU per episode (write_many: checks, digests, {r.get('deflate', 'zlib')} deflate, containers, commit):"
        )
        for name, v in w.items():
            row(f"  {name}", f"{v['median_ms']:.2f} ms ({v['min_ms']:.2f} to {v['max_ms']:.2f})")
    p = r.get("producer")
    if p is not None:
        row(
            f"at {p['rate']:.0f} episodes/s (synthetic producer, {p['work_ms']:.0f} ms of host work an episode, {p['episodes']} episodes x {p['rounds']} rounds):"
        )
        for name in (k for k in p if isinstance(p[k], dict) and "cost" in p[k]):
            w, c = p[name], p[name]["cost"]
            cpu = (
                f", writer CPU {w['writer_cpu_ms']:.1f} ms an episode ({w['writer_cores']:.2f} cores)"
                if "writer_cpu_ms" in w
                else ""
            )
            row(
                f"  writer: {name}",
                f"cost of rollout wall {cost_text(c, r.get('load'))}; behind {w['late_ms']:.0f} ms at the end, drain {w['drain_ms']:.0f} ms, longest hand-off {w['handoff_max_ms']:.1f} ms{cpu}",
            )
