"""BENCHMARKS.md's LeRobot figures: paired success of two runs on the same seeds, and chunk latency eager vs captured.

    # success: two `rollcap run`s with the same --seed and --episodes (the same episode seeds), then
    python scripts/lerobot_figures.py success runs/act_202 runs/flow_202
    # latency: a LeRobot policy eager and captured (jit), a tiny Diffusion Policy (DDIM, built here, random weights)
    # eager and captured, beside the shipped FlowVLA eager and captured, all on one thread
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
    out["difference"] = {
        "a_minus_b": float(d.mean()),
        "ci95": [float(d.mean() - half), float(d.mean() + half)],
        "only_a": only_a,
        "only_b": only_b,
        "mcnemar_p": mcnemar_p(only_a, only_b),
    }
    return out


def _time(policy, observations, noise) -> list[float]:
    out = []
    for obs in observations:
        t0 = time.perf_counter()
        policy.start(obs, noise)
        policy.result()
        out.append(time.perf_counter() - t0)
    return out


def _stats(per_repeat: list[list[float]]) -> dict:
    """Median and p90 over every chunk, and the spread of the per-repeat medians (min, max)."""
    ms = 1000 * np.asarray(per_repeat)
    medians = np.median(ms, axis=1)
    return {
        "median_ms": float(np.median(ms)),
        "p90_ms": float(np.percentile(ms, 90)),
        "n": int(ms.size),
        "repeat_medians_ms": [float(medians.min()), float(medians.max())],
    }


def _pair(eager, captured, observations, repeats: int) -> dict:
    """Eager and captured interleaved per repeat (the box's load hits both alike), after a warm-up of 10 chunks each,
    and whether their chunks on ``observations`` are byte-identical."""
    noise = np.zeros(eager.chunk_shape, np.float32)
    for p in (eager, captured):
        _time(p, observations[:10], noise)
    times: dict[str, list] = {"eager": [], "captured": []}
    for _ in range(repeats):
        times["eager"].append(_time(eager, observations, noise))
        times["captured"].append(_time(captured, observations, noise))
    same = 0
    for obs in observations:
        got = []
        for p in (eager, captured):
            p.start(obs, noise)
            got.append(p.result())
        same += got[0].tobytes() == got[1].tobytes()
    return {
        "kind": eager.state_fingerprint().get("kind", getattr(eager, "kind", type(eager).__name__)),
        "eager": _stats(times["eager"]),
        "captured": {
            **_stats(times["captured"]),
            "backend": captured.backend,
            "probe_max_abs_diff": getattr(captured, "capture_max_abs_diff", None),
        },
        "byte_identical_chunks": f"{same}/{len(observations)}",
    }


def tiny_diffusion(directory, like) -> str:
    """A Diffusion Policy (DDIM, 10 denoising steps, U-Net down_dims 32/64/128, horizon 16, 2 observation steps),
    random weights, reading the same input features as the LeRobot policy ``like``; saved with its processors."""
    import torch
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    stats = {}
    for name, feat in {**like.cfg.input_features, **like.cfg.output_features}.items():
        n = tuple(feat.shape)
        stats[name] = {"mean": torch.zeros(n), "std": torch.ones(n), "min": -torch.ones(n), "max": torch.ones(n)}
    cfg = DiffusionConfig(
        input_features=dict(like.cfg.input_features),
        output_features=dict(like.cfg.output_features),
        n_obs_steps=2,
        horizon=16,
        n_action_steps=8,
        down_dims=(32, 64, 128),
        noise_scheduler_type="DDIM",
        num_train_timesteps=100,
        num_inference_steps=10,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    torch.manual_seed(0)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    DiffusionPolicy(cfg).save_pretrained(directory)
    pre.save_pretrained(directory)
    post.save_pretrained(directory)
    return str(directory)


def latency(lerobot_dir, run, repeats: int = 5, threads: int = 1) -> dict:
    """Median and p90 milliseconds per chunk (start + result, one thread) on the boundary observations of ``run``:
    the LeRobot policy eager and captured (jit), a tiny DDIM Diffusion Policy eager and captured, the shipped
    FlowVLA eager and captured (jit), each pair interleaved per repeat, on the same observations."""
    import tempfile

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
    out = {"threads": threads, "observations": len(observations), "repeats": repeats}
    eager = LeRobotPolicy.load(lerobot_dir)
    out["lerobot"] = _pair(
        eager, LeRobotPolicy.load(lerobot_dir, backend="jit", threads=threads), observations, repeats
    )
    with tempfile.TemporaryDirectory() as tmp:
        dp = tiny_diffusion(tmp, eager)
        out["diffusion_ddim_tiny"] = _pair(
            LeRobotPolicy.load(dp), LeRobotPolicy.load(dp, backend="jit", threads=threads), observations, repeats
        )
    model = load_policy(DEFAULT_CHECKPOINT)
    runners = [PolicyRunner(model, "cpu", backend, make_lane("policy", "cpu", threads)) for backend in ("eager", "jit")]
    try:
        out["flowvla"] = _pair(*runners, observations, repeats)
    finally:
        for r in runners:
            r.close()
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
    result = (
        success(args.run_a, args.run_b) if args.what == "success" else latency(args.lerobot_dir, args.run, args.repeats)
    )
    print(json.dumps(result, indent=2))
