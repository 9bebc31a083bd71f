"""Issue 57's CPU goals, old tree against this one, side by side in one run (interleaved rounds, fresh processes).

    python scripts/issue57_ab.py --old 0a3bd10 [--rounds 3] [--json ab.json] [--only writer,host]

Exports the old commit with ``git archive`` into a temp directory and imports it through ``PYTHONPATH`` (a
``rollcap`` package whose parts are that tree's folders), so both trees run on this interpreter and its packages.
Each round runs, for the old tree then this one, each in fresh processes:

- ``rollcap --help`` and ``rollcap run --help`` (wall seconds, through ``python -m rollcap.rollout.cli``);
- one env worker (``EnvWorkers`` over the batch bench's 1 ms stand-in at batch 2, one worker): spawn to ready
  (the pool's construction) and the worker's peak RSS (``VmHWM`` read from ``/proc/<pid>/status`` while it lives);
- the writer's CPU per episode (``EpisodeRecorder.write_many``, npz + HDF5, one and 16 episodes a commit) over the
  same 20 recorded PushBlock episodes (recorded once, by this tree, with the shipped policy), the median of three
  runs each (alternating) in one process;
- the in-process host's work per slot and round at batch 32 with a 2 ms stand-in (``bench.batch.host_per_slot``), and
  the same host's launch (with the replay's host part: the rows copied in) and decide alone (``iso_*``: round after
  round on the same observations, no env step between, so the envs' data does not crowd the caches).

Prints a markdown table (median, range over the rounds) and the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("kernels", "capsule", "policies", "critics", "envs", "rollout")

WORKER = """
import json, time
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env
from rollcap.rollout.bench.batch import _runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.workers import EnvWorkers
parts = Parts()
env = make_env(parts.env_id, parts.env_kwargs)
policy, critic = _runners(parts, 2, env, 1e-3)
t0 = time.perf_counter()
pool = EnvWorkers(parts.env_id, parts.env_kwargs, policy, critic, HostConfig(), workers=1)
s = time.perf_counter() - t0
with open(f"/proc/{pool.procs[0].pid}/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
pool.close()
print(json.dumps({"worker_start_s": s, "worker_rss_mb": hwm}))
"""

WRITER = """
import copy, json, statistics, sys, tempfile, time
from pathlib import Path
from rollcap.rollout.recording import EpisodeRecorder, load_any
records = list(load_any(sys.argv[1]))
meta = {"env_name": "rollcap/PushBlock-v0", "type": 2, "env_kwargs": {}}
got = {1: [], 16: []}
for _ in range(3):  # each batch size three times, alternating: the median of three runs of 20 episodes
    for per in (1, 16):
        fresh = [copy.deepcopy(r) for r in records]
        with tempfile.TemporaryDirectory() as tmp:
            rec = EpisodeRecorder(tmp, ("npz", "h5"), meta)
            c0 = time.thread_time()
            for k in range(0, len(fresh), per):
                rec.write_many(fresh[k:k + per])
            got[per].append(1e3 * (time.thread_time() - c0) / len(fresh))
            rec.close()
print(json.dumps({f"writer_{per}_ms": statistics.median(v) for per, v in got.items()}))
"""

HOST = """
import json
from rollcap.rollout.spec import Parts
from rollcap.rollout.bench.batch import host_per_slot
r = host_per_slot(Parts(), 32, 30)
print(json.dumps({"host_us": r["host_us_per_slot_round"], "launch_us": r["launch_us"], "replay_us": r.get("replay_us", 0.0),
                  "decide_us": r["decide_us"]}))
"""

ISOLATED = """
import json, statistics, time
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env
from rollcap.rollout.bench.batch import _runners
from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.config import HostConfig
parts, n = Parts(), 32
envs = [make_env(parts.env_id, parts.env_kwargs) for _ in range(n)]
policy, critic = _runners(parts, n, envs[0], 2e-3)
core = BatchedCore(envs, policy, critic, HostConfig(seed=5), records=False, workers=0)
for i in range(n):
    core.hosts[i].start(i)
got = {"iso_launch_us": [], "iso_decide_us": []}
for k in range(60):  # the boundary's two halves round after round, the same observations: the host's own work alone
    c0 = time.thread_time()
    tickets = [h.launch() for h in core.hosts]
    for rows in core.policy_rows + core.critic_rows:  # the replay's host part (the rows copied in) counts as launch
        rows.launch()
    c1 = time.thread_time()
    for h in core.hosts:
        h.draw_ahead()
    for rows in core.policy_rows + core.critic_rows:
        rows.wait()
    c2 = time.thread_time()
    for h, t in zip(core.hosts, tickets):
        h.decide(t)
    c3 = time.thread_time()
    for h in core.hosts:  # as if the chunk ran: back at the next boundary
        h._ep.pending, h._ep.chunk = None, h._ep.chunk + 1
    if k >= 10:
        got["iso_launch_us"].append(1e6 * (c1 - c0) / n)
        got["iso_decide_us"].append(1e6 * (c3 - c2) / n)
core.close()
print(json.dumps({k: statistics.median(v) for k, v in got.items()}))
"""

RECORD = """
import sys
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.recording import EpisodeRecorder
parts = Parts()
env = make_env(parts.env_id, parts.env_kwargs)
policy, critic = make_runners(parts, env)
rec = EpisodeRecorder(sys.argv[1], ("npz",), {"env_name": parts.env_id, "type": 2, "env_kwargs": {}})
RolloutHost(env, policy, critic, HostConfig(seed=11), [rec]).run(20)
"""


def _old_tree(commit: str, where: Path) -> Path:
    """``commit``'s tree as an importable ``rollcap`` (its parts' folders under one package), returned as a PYTHONPATH entry."""
    tree = where / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    pkg = where / "pkg" / "rollcap"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_bytes((tree / "rollcap" / "__init__.py").read_bytes())
    for part in PARTS:
        (pkg / part).symlink_to(tree / part)
    return where / "pkg"


def _run(env: dict, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd="/")


PARTS_MEASURED = ("start", "worker", "writer", "host")


def _measure(env: dict, episodes: Path, only: set[str]) -> dict:
    out = {}
    for name, argv in (("help_s", ["--help"]), ("run_help_s", ["run", "--help"])) if "start" in only else ():
        t0 = time.perf_counter()
        _run(env, "-m", "rollcap.rollout.cli", *argv).check_returncode()
        out[name] = time.perf_counter() - t0
    steps = {"worker": [(WORKER, ())], "writer": [(WRITER, (str(episodes),))], "host": [(HOST, ()), (ISOLATED, ())]}
    for code, args in [step for part in PARTS_MEASURED if part in only for step in steps.get(part, ())]:
        res = _run(env, "-c", code, *args)
        if res.returncode:
            raise RuntimeError(res.stderr[-2000:])
        out.update(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="the commit to compare with (e.g. 0a3bd10)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--only",
        default=",".join(PARTS_MEASURED),
        help=f"comma-separated parts to measure (default: all of {PARTS_MEASURED})",
    )
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS_MEASURED):
        ap.error(f"--only: unknown part(s) {sorted(only - set(PARTS_MEASURED))}; choose from {PARTS_MEASURED}")
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rollcap-ab57-") as tmp:
        tmp = Path(tmp)
        old_path = _old_tree(args.old, tmp)
        new_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        old_env = {**new_env, "PYTHONPATH": str(old_path)}
        episodes = tmp / "episodes"
        _run(new_env, "-c", RECORD, str(episodes)).check_returncode()
        got: dict[str, list[dict]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for name, env in (("old", old_env), ("new", new_env)):
                got[name].append(_measure(env, episodes, only))
                print(f"round {r} {name}: {json.dumps(got[name][-1])}", file=sys.stderr)
    load1 = os.getloadavg()
    keys = list(got["new"][0])
    print(f"| figure ({args.rounds} rounds, median (range)) | {args.old} | this tree |")
    print("| --- | --- | --- |")
    for k in keys:
        cells = []
        for name in ("old", "new"):
            xs = sorted(m[k] for m in got[name])
            cells.append(f"{statistics.median(xs):.2f} ({xs[0]:.2f}-{xs[-1]:.2f})")
        print(f"| {k} | {cells[0]} | {cells[1]} |")
    print(f"load average {load0[0]:.1f} before, {load1[0]:.1f} after ({os.cpu_count()} cpus)")
    if args.json:
        args.json.write_text(json.dumps({"old": args.old, "runs": got, "load": [load0, load1]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
