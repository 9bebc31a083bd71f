"""Costs as a run grows: HDF5 append time, loader memory, ``rollcap run`` RSS.

    python3 -m rollcap.rollout.bench.growth --episodes 5000 --run-episodes 2000 --json growth.json

Why: a per-episode cost that grows with the file (an HDF5 metadata rewrite,
a rollback journal holding more pages, a loader holding the whole run) is
invisible in a 10-episode benchmark and dominant in a 5,000-episode one.

- **HDF5 append**: ``--episodes`` small synthetic episodes (every field of a
  real record; 8 steps, two 16x16 cameras) appended to one file through
  :class:`~rollcap.rollout.recording.h5.H5Writer`; the wall of each append and
  its CPU time (what does not depend on the disk) and the pages its journal
  saved, reported around episodes 1, 100, 1,000 and
  5,000 (median of the 10 appends from there).
- **Loader memory**: peak RSS of a fresh process that reads every episode of
  that file, copied at 100, 1,000 and ``--episodes`` episodes, whole
  (``load_any``) and streamed (``iter_any``, what ``rollcap inspect`` uses).
- **Run RSS**: ``rollcap run --episodes N`` in a subprocess, its RSS sampled
  every second against the episodes written so far.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARKS = (1, 100, 1000, 5000)


def h5_append_growth(episodes: int, directory: Path, copies_at=(100, 1000)) -> dict:
    """Append ``episodes`` synthetic episodes to one HDF5 file; wall and journaled pages per append."""
    from rollcap.rollout.recording import journal
    from rollcap.rollout.recording.h5 import H5Writer
    from rollcap.rollout.recording.recorder import synthetic_record

    pages: list[int] = []
    commit = journal.PagedFile.commit

    def counting_commit(self, jfd):  # instrumentation only: how many committed pages this append rewrote
        pages.append(len(self._pages))
        return commit(self, jfd)

    path = directory / "growth.hdf5"
    walls, cpus, sizes, copies = [], [], [], {}
    journal.PagedFile.commit = counting_commit
    try:
        writer = H5Writer(path, {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}})
        for i in range(episodes):
            rec = synthetic_record(i, i, steps=8, image_size=16)
            t0, c0 = time.perf_counter(), time.thread_time()
            writer.append(rec)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
            sizes.append(path.stat().st_size)
            if i + 1 in copies_at:
                copies[i + 1] = directory / f"growth_{i + 1}.hdf5"
                shutil.copyfile(path, copies[i + 1])
        writer.close()
    finally:
        journal.PagedFile.commit = commit
    copies[episodes] = path
    rows = []
    for mark in [m for m in MARKS if m <= episodes] or [episodes]:
        lo = min(mark - 1, episodes - 10) if episodes >= 10 else 0
        window = slice(max(lo, 0), max(lo, 0) + 10)
        rows.append(
            {
                "episode": mark,
                "append_ms": statistics.median(walls[window]) * 1e3,
                "append_ms_min": min(walls[window]) * 1e3,
                "append_ms_max": max(walls[window]) * 1e3,
                "append_cpu_ms": statistics.median(cpus[window]) * 1e3,
                "journaled_pages": statistics.median(pages[window]),
                "file_mb": sizes[window.start] / 1e6,
            }
        )
    return {"episodes": episodes, "rows": rows, "files": {str(k): str(v) for k, v in copies.items()}}


_READ = {
    "load_any (whole run)": "from rollcap.rollout.recording.runs import load_any as f; n = len(f(p))",
    "iter_any (streamed)": "from rollcap.rollout.recording.runs import iter_any as f; n = sum(1 for _ in f(p))",
}


def peak_rss_mb(code: str) -> float:
    """Peak RSS (MB) of a fresh ``python3 -c code``: its own ``VmHWM``, read by itself at the end.

    (``wait4``'s ``ru_maxrss`` would include the parent's RSS from before ``exec``.)
    """
    probe = "\nimport sys\nsys.stdout.write(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    proc = subprocess.run([sys.executable, "-c", code + probe], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"reader failed ({proc.returncode}): {code}: {proc.stderr[-300:]}")
    return int(proc.stdout.split()[-2]) / 1024


def loader_memory(files: dict[str, str]) -> list[dict]:
    """Peak RSS of reading each file whole and streamed, in fresh processes."""
    rows = []
    for n, path in sorted(files.items(), key=lambda kv: int(kv[0])):
        row = {"episodes": int(n), "file_mb": Path(path).stat().st_size / 1e6}
        for name, body in _READ.items():
            row[name] = peak_rss_mb(f"p = {path!r}; {body}")
        rows.append(row)
    return rows


def run_rss(episodes: int, directory: Path, every_s: float = 1.0) -> dict:
    """``rollcap run --episodes N`` in a subprocess: (seconds, episodes written, RSS MB) samples."""
    out = directory / "run"
    cmd = [
        sys.executable,
        "-m",
        "rollcap.rollout.cli",
        "run",
        "--episodes",
        str(episodes),
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples, t0 = [], time.perf_counter()
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024
            done = sum(1 for _ in (out / "episodes").glob("episode_*.npz")) if (out / "episodes").is_dir() else 0
            samples.append((time.perf_counter() - t0, done, rss))
        except (FileNotFoundError, StopIteration, ProcessLookupError):
            pass
        time.sleep(every_s)
    if proc.returncode:
        raise RuntimeError(f"rollcap run failed ({proc.returncode}): {proc.stderr.read()[-500:]}")
    marks = {}
    for want in (50, 100, 500, 1000, 1500, episodes):
        at = [rss for _, done, rss in samples if done >= want]
        if at:
            marks[want] = at[0]
    return {"episodes": episodes, "wall_s": time.perf_counter() - t0, "rss_mb_at_episode": marks, "samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rollcap.rollout.bench.growth", description=__doc__.split("\n\n")[2])
    ap.add_argument(
        "--episodes",
        type=int,
        default=5000,
        help="synthetic episodes appended to one HDF5 file (default 5000; 0: skip)",
    )
    ap.add_argument(
        "--run-episodes", type=int, default=0, help="also sample the RSS of `rollcap run --episodes N` (0: skip)"
    )
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.episodes and args.episodes < 10:
        ap.error(f"--episodes: 0 (skip) or at least 10, got {args.episodes}")
    report: dict = {}
    with tempfile.TemporaryDirectory(prefix="rollcap-growth-") as tmp:
        tmp = Path(tmp)
        if args.episodes:
            report["h5_append"] = h5_append_growth(args.episodes, tmp)
            print("HDF5 append per episode (median of 10 appends from the mark; min-max):")
            for r in report["h5_append"]["rows"]:
                print(
                    f"  episode {r['episode']:>5}: {r['append_ms']:.2f} ms ({r['append_ms_min']:.2f}-{r['append_ms_max']:.2f}), CPU {r['append_cpu_ms']:.2f} ms, journal {r['journaled_pages']:.0f} pages, file {r['file_mb']:.1f} MB"
                )
            report["loader_memory"] = loader_memory(report["h5_append"]["files"])
            print("peak RSS reading every episode (fresh process):")
            for r in report["loader_memory"]:
                print(
                    f"  {r['episodes']:>5} episodes ({r['file_mb']:.1f} MB): "
                    + ", ".join(f"{k} {r[k]:.0f} MB" for k in _READ)
                )
        if args.run_episodes:
            report["run_rss"] = run_rss(args.run_episodes, tmp)
            marks = report["run_rss"]["rss_mb_at_episode"]
            print(
                f"rollcap run --episodes {args.run_episodes}: RSS "
                + ", ".join(f"{v:.0f} MB at episode {k}" for k, v in marks.items())
                + f"; {report['run_rss']['wall_s']:.0f} s"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
