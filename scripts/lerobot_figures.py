"""BENCHMARKS.md's LeRobot figures: paired success of two runs on the same seeds, and chunk latency eager vs captured.

    # success: two `rollcap run`s with the same --seed and --episodes (the same episode seeds), then
    python scripts/lerobot_figures.py success runs/act_202 runs/flow_202
    # latency: a LeRobot policy (eager; no capture applies, see BENCHMARKS.md) beside the shipped FlowVLA eager and captured
    python scripts/lerobot_figures.py latency examples/lerobot_act --run runs/act_202

Run it with LeRobot's venv (it loads the LeRobot policy). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def success(run_a, run_b) -> dict:
    """Per-seed success of two runs paired by episode index: rates with Wilson 95% intervals, the paired
    difference with a normal 95% interval, and the exact McNemar p over the discordant seeds."""
    from rollcap.rollout.stats import mcnemar_p, wilson
    from rollcap.rollout.recording import iter_any

    runs = []
    for run in (run_a, run_b):
        runs.append({r.index: (r.seed, bool(r.success)) for r in iter_any(run)})
    a, b = runs
    if sorted(a) != sorted(b) or any(a[i][0] != b[i][0] for i in a):
        raise SystemExit("the two runs do not hold the same episodes with the same seeds (same --seed and --episodes?)")
    sa = np.array([a[i][1] for i in sorted(a)])
    sb = np.array([b[i][1] for i in sorted(b)])
    n = len(sa)
    d = sa.astype(float) - sb.astype(float)
    half = 1.96 * d.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    only_a, only_b = int((sa & ~sb).sum()), int((sb & ~sa).sum())
    out = {"episodes": n}
    for name, s in ((str(run_a), sa), (str(run_b), sb)):
        p, lo, hi = wilson(int(s.sum()), n)
        out[name] = {"successes": int(s.sum()), "rate": p, "wilson95": [lo, hi]}
    out["difference"] = {"a_minus_b": float(d.mean()), "ci95": [float(d.mean() - half), float(d.mean() + half)], "only_a": only_a, "only_b": only_b, "mcnemar_p": mcnemar_p(only_a, only_b)}
    return out


def _time(policy, observations, noise, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        for obs in observations:
            t0 = time.perf_counter()
            policy.start(obs, noise)
            policy.result()
            out.append(time.perf_counter() - t0)
    return out


def latency(lerobot_dir, run, repeats: int = 5, threads: int = 1) -> dict:
    """Median and p90 milliseconds per chunk (start + result, one thread) on the boundary observations of ``run``:
    the LeRobot policy eager, the shipped FlowVLA eager and captured (jit), on the same observations."""
    import torch
    from rollcap.kernels.lanes import make_lane
    from rollcap.policies import DEFAULT_CHECKPOINT, PolicyRunner, load_policy
    from rollcap.policies.lerobot import LeRobotPolicy
    from rollcap.rollout.protocols import observation_at
    from rollcap.rollout.recording import iter_any

    torch.set_num_threads(threads)
    observations = []
    for rec in iter_any(run):
        observations += [observation_at(rec, int(t)) for t in rec.chunks["chunk_start"]]
        if len(observations) >= 100:
            break
    observations = observations[:100]

    def stats(xs):
        ms = 1000 * np.asarray(xs)
        return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "n": len(ms)}

    out = {"threads": threads, "observations": len(observations)}
    lr = LeRobotPolicy.load(lerobot_dir)
    _time(lr, observations[:10], np.zeros(lr.chunk_shape, np.float32), 1)  # warm-up
    out["lerobot_eager"] = {**stats(_time(lr, observations, np.zeros(lr.chunk_shape, np.float32), repeats)), "kind": lr.state_fingerprint()["kind"]}
    model = load_policy(DEFAULT_CHECKPOINT)
    for backend in ("eager", "jit"):
        runner = PolicyRunner(model, "cpu", backend, make_lane("policy", "cpu", threads))
        noise = np.zeros(runner.chunk_shape, np.float32)
        try:
            _time(runner, observations[:10], noise, 1)
            out[f"flowvla_{backend}"] = stats(_time(runner, observations, noise, repeats))
        finally:
            runner.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("success")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p = sub.add_parser("latency")
    p.add_argument("lerobot_dir")
    p.add_argument("--run", required=True, help="a run whose boundary observations are fed to the policies")
    p.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    result = success(args.run_a, args.run_b) if args.what == "success" else latency(args.lerobot_dir, args.run, args.repeats)
    print(json.dumps(result, indent=2))
