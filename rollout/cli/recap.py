"""``rollcap recap``: one RECAP iteration on recorded runs (registered by :mod:`rollcap.rollout.cli.commands`)."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = (
    "One RECAP iteration on recorded runs: collect their episodes and the shipped demonstrations, refit the critic "
    "(critic-stopped episodes bootstrapped, not counted as failures), label N-step advantages positive above a percentile "
    "per task (interventions positive), fine-tune the policy with the advantage indicator, choose the guidance weight on "
    "validation seeds, and evaluate before vs after on held-out seeds (Wilson intervals, paired difference, exact McNemar). "
    "Writes policy.json/.safetensors, critic.json/.safetensors and the manifest recap.json into --out."
)
EXAMPLE = "rollcap run --episodes 300 --seed 17 --execute-steps 8 --format npz --out runs/collect && rollcap recap runs/collect --out runs/recap1"


def add_parser(command) -> None:
    """Register ``recap`` through the main CLI's ``command(name, func, help, description, example)``."""
    from rollcap.rollout.options import Options
    from rollcap.rollout.learn.recap.config import RecapConfig

    p = command(
        "recap",
        cmd_recap,
        "learn from recorded runs: refit the critic, fine-tune the policy, evaluate (RECAP)",
        DESCRIPTION,
        EXAMPLE,
    )
    p.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories (or recording files) to learn from"
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="new directory for the checkpoints and recap.json (must be empty or absent)",
    )
    opts = Options(p)
    opts.add(RecapConfig)
    p.set_defaults(options=opts)


def cmd_recap(args: argparse.Namespace) -> int:
    from rollcap.rollout.learn.recap.config import RecapConfig
    from rollcap.rollout.learn.recap.pipeline import recap

    cfg = RecapConfig(**args.options.values(args, RecapConfig))
    m = recap(args.runs, args.out, cfg, log=lambda line: print(line, flush=True))
    print(table(m))
    return 0


def table(m: dict) -> str:
    """The evaluation as a small text table (one row per execute_steps)."""
    rows = [
        f"{'execute_steps':>13}  {'before':>22}  {'after':>22}  {'difference (95% CI)':>26}  {'fixed/broken':>12}  McNemar p"
    ]
    for s, r in m["evaluate"]["results"].items():
        b, a, d = r["before"]["rate_ci"], r["after"]["rate_ci"], r["difference_ci"]
        rows.append(f"{s:>13}  {b[0]:6.1%} ({b[1]:.1%}-{b[2]:.1%})  {a[0]:6.1%} ({a[1]:.1%}-{a[2]:.1%})  "
                    f"{d[0] * 100:+6.1f} ({d[1] * 100:+.1f} to {d[2] * 100:+.1f}) pts  {r['fixed']:>5}/{r['broken']:<6}  {r['mcnemar_p']:.3g}")  # fmt: skip
    envs = len(m["evaluate"].get("envs") or [m["evaluate"]["env"]])
    rows.append(
        f"held-out seeds: {m['evaluate']['seeds']['n']}"
        + (f" in each of {envs} envs" if envs > 1 else "")
        + f"; guidance weight {m['improve']['beta']:g}; policy {m['policy']['to_digest'][:19]}...; {m['seconds']['total']:.0f} s"
    )
    return "\n".join(rows)
