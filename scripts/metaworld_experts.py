"""BENCHMARKS.md's MetaWorld expert table: each task's scripted expert (`--policy expert[:STD]`) under the host.

    OMP_NUM_THREADS=1 nice -n 5 python scripts/metaworld_experts.py --episodes 200 --seed 2323 --std 0 0.1 --out runs/mw_experts

For each task and noise level it runs what

    rollcap run --env rollcap/MetaWorld-<task> --env-kwargs '{"render_images": false}' --policy expert:<STD> \\
        --critic none --episodes N --seed S --threads 1 --format npz --out OUT/<task>_std<STD>

runs (through ``rollcap.run``), then prints one markdown table read back from the recordings: successes,
rate with its Wilson 95% interval, mean episode length (an episode ends at its first success, as MetaWorld's
evaluation with ``terminate_on_success``; a failure runs to the 500-step limit) and the run's wall time. A run
directory that already holds ``summary.json`` is read, not run again (``--tasks`` picks tasks; default MT10).

``--policy CKPT`` runs a checkpoint instead of the experts (``--std`` is then ignored), into ``OUT/<task>``,
``--critic CKPT`` a critic beside it (``--critic-threshold`` its stop threshold):

    OMP_NUM_THREADS=1 nice -n 5 python scripts/metaworld_experts.py --policy policies/weights/mt10_policy.json \
        --episodes 200 --seed 31337 --out runs/mt10_eval
    OMP_NUM_THREADS=1 nice -n 5 python scripts/metaworld_experts.py --policy policies/weights/mt10_policy.json \
        --critic critics/weights/mt10_critic.json --episodes 200 --seed 31337 --out runs/mt10_eval_critic
    rollcap inspect runs/mt10_eval_critic/* --early-stop -0.9 -0.8     # what each threshold would do to those episodes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def run_one(task: str, std: float, episodes: int, seed: int, out: Path, policy: str | None = None, critic: str = "none", threshold: float | None = None,
            patience: int = 2) -> Path:  # fmt: skip
    """Record ``episodes`` of ``task``'s expert at noise ``std`` (or of checkpoint ``policy``, with ``critic`` and its stop
    ``threshold``) into ``out`` (skipped when it is already there)."""
    import rollcap

    if not (out / "summary.json").is_file():
        spec = policy or f"expert:{std:g}"
        rollcap.run(episodes, out=out, env=f"rollcap/MetaWorld-{task}", env_kwargs={"render_images": False}, policy=spec,
                    critic=critic, critic_threshold=threshold, critic_patience=patience, seed=seed, threads=1, formats=("npz",), progress=False)  # fmt: skip
    return out


def row(task: str, std: float, run: Path) -> dict:
    """One table row from a run directory's recordings and summary."""
    from rollcap.rollout.recording import iter_any
    from rollcap.rollout.stats import wilson

    recs = [(r.seed, bool(r.success), int(r.num_steps), r.stop_reason) for r in iter_any(run)]
    k, n = sum(s for _, s, _, _ in recs), len(recs)
    p, lo, hi = wilson(k, n)
    summary = json.loads((run / "summary.json").read_text())
    steps = np.array([t for _, _, t, _ in recs])
    return {"task": task, "std": std, "successes": k, "episodes": n, "rate": p, "lo": lo, "hi": hi, "mean_steps": float(steps.mean()),
            "mean_steps_success": float(steps[[s for _, s, _, _ in recs]].mean()) if k else float("nan"),
            "stops": summary["stop_reasons"], "wall_s": summary["wall_s"],
            "failed_seeds": [sd for sd, s, _, _ in recs if not s][:10]}  # fmt: skip


def main() -> None:
    from rollcap.envs.metaworld import MT10

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2323)
    ap.add_argument("--std", type=float, nargs="+", default=[0.0, 0.1])
    ap.add_argument("--tasks", nargs="+", default=list(MT10))
    ap.add_argument("--out", type=Path, default=Path("runs/mw_experts"))
    ap.add_argument("--policy", default=None, help="a checkpoint to run instead of the experts (--std ignored)")
    ap.add_argument(
        "--critic", default="none", help="with --policy: a critic checkpoint to run beside it (default none)"
    )
    ap.add_argument(
        "--critic-threshold",
        type=float,
        default=None,
        help="with --critic: its stop threshold (default: none, the critic only records its values)",
    )
    ap.add_argument(
        "--critic-patience",
        type=int,
        default=2,
        help="with --critic-threshold: boundaries below it before a stop (default 2)",
    )
    args = ap.parse_args()
    rows = []
    for std in [float("nan")] if args.policy else args.std:
        for task in args.tasks:
            t0 = time.perf_counter()
            where = args.out / (task if args.policy else f"{task}_std{std:g}")
            run = run_one(
                task,
                std,
                args.episodes,
                args.seed,
                where,
                args.policy,
                args.critic,
                args.critic_threshold,
                args.critic_patience,
            )
            rows.append(row(task, std, run))
            line = {
                k: (None if isinstance(v, float) and v != v else v) for k, v in rows[-1].items()
            }  # NaN is not JSON: null
            print(json.dumps({**line, "elapsed_s": round(time.perf_counter() - t0, 1)}, allow_nan=False), flush=True)
    print("\n| task | noise | successes | rate (Wilson 95%) | mean steps (successes) | wall |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['task']} | {'policy' if r['std'] != r['std'] else format(r['std'], 'g')} | {r['successes']}/{r['episodes']} | {r['rate']:.1%} ({r['lo']:.1%}–{r['hi']:.1%}) | "
              f"{r['mean_steps']:.1f} ({r['mean_steps_success']:.1f}) | {r['wall_s']:.1f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
