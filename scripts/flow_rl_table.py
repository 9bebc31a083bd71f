r"""The held-out table of examples/flow_rl.py runs, as Markdown: one row per run.

    python scripts/flow_rl_table.py runs/flow/push-0 runs/flow/push-1 runs/flow/push-2

Columns: the run, its budget (minutes, iterations, episodes, transitions, updates), the held-in curve (successes of
the plain sampler at each checkpoint; the kept one starred), held-out tuned / start with own noise and with zero noise
(95% Wilson), the paired differences with McNemar's exact p, and the capture count. A run whose evaluation did not
finish is listed with what it has.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEADER = (
    "| run | budget | held-in (plain sampler; * kept) | held-out own noise: tuned vs start | fixed / broken, p "
    "| zero noise: tuned vs start | fixed / broken, p | captures |"
)


def _pct(k: int, n: int, wil=None) -> str:
    ci = "" if wil is None else f" ({100 * wil[1]:.1f}–{100 * wil[2]:.1f})"
    return f"{k}/{n} = {100 * k / n:.1f}%{ci}"


def _side(c: dict | None) -> list[str]:
    if c is None:
        return ["n/a", "n/a"]
    n, (d, lo, hi) = c["episodes"], c["difference_and_95ci"]
    return [
        f"{_pct(c['tuned'], n, c['tuned_wilson'])} vs {_pct(c['start'], n)}",
        f"{100 * d:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f}), {c['fixed']} / {c['broken']}, p {c['mcnemar_p']:.2g}",
    ]


def row(run: Path) -> str:
    r = json.loads((run / "result.json").read_text())
    b = r["budget"]
    budget = (f"{b['minutes']:.1f} min, {b['iterations']} it., {b['episodes']:,} ep., {b['transitions']:,} tr., "
              f"{b['updates']} upd.")  # fmt: skip
    kept = (r.get("kept") or {}).get("iteration")
    pts = " ".join(f"{p['success']}{'*' if p['iteration'] == kept else ''}" for p in r["held_in"])
    n = r["held_in"][0]["episodes"] if r["held_in"] else 0
    ev = r.get("eval") or {}
    cap = b.get("capture_count", {})
    caps = f"{cap.get('graphs', '?')} graphs, {cap.get('captures_during_training', '?')} during training"
    return (
        "| "
        + " | ".join([run.name, budget, f"{pts} (of {n})", *_side(ev.get("own")), *_side(ev.get("zero_noise")), caps])
        + " |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args(argv)
    print(HEADER)
    print("| " + " | ".join(["---"] * 8) + " |")
    for run in a.runs:
        if not (run / "result.json").is_file():
            print(f"{sys.argv[0]}: {run}: no result.json", file=sys.stderr)
            return 2
        print(row(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
