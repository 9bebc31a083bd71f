r"""The held-out table of examples/dsrl.py runs, as Markdown: one row per scored agent (the kept one, the
``--snapshot-minutes`` one, the last one when keep-best kept an earlier agent).

    python scripts/dsrl_table.py runs/dsrl43/peg-60-0 runs/dsrl43/peg-60-1 runs/dsrl43/peg-60-2

Columns: the agent, its training budget (minutes of wall, transitions, critic updates), the held-in checkpoint it is
(held-in success against zero noise on the same episodes), held-out steered / frozen / zero noise (95% Wilson), and the
paired comparisons with McNemar's exact p. A run whose evaluation did not finish is listed with what it has.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEADER = (
    "| run | agent | budget | held-in (agent vs zero noise) | held-out steered | frozen | zero noise "
    "| vs frozen: fixed / broken, p | vs zero noise: points, fixed / broken, p |"
)


def _pct(k: int, n: int, wil=None) -> str:
    ci = "" if wil is None else f" ({100 * wil[1]:.1f}–{100 * wil[2]:.1f})"
    return f"{k}/{n} = {100 * k / n:.1f}%{ci}"


def _budget(b: dict) -> str:
    return f"{b['seconds'] / 60:.1f} min, {b['transitions']:,} transitions, {b['critic_updates']:,} critic updates"


def _held_in(p: dict | None) -> str:
    if p is None:
        return "n/a"
    n = p["episodes"]
    return f"{p['success']}/{n} vs {p['zero_noise']}/{n} (min {p['minutes']:.1f}, {p['transitions']:,} tr.)"


def _eval(e: dict | None) -> list[str]:
    if e is None:
        return ["not scored"] * 5
    n, z = e["episodes"], e["vs_zero_noise"]
    d = z["difference_and_95ci"][0]
    return [
        _pct(e["steered_success"], n, e["steered_wilson"]),
        _pct(e["frozen_success"], n),
        _pct(e["zero_noise_success"], n),
        f"{e['fixed']} / {e['broken']}, {e['mcnemar_p']:.2g}",
        f"{100 * d:+.1f}, {z['fixed']} / {z['broken']}, {z['mcnemar_p']:.2g}",
    ]


def rows(run: Path) -> list[str]:
    r = json.loads((run / "result.json").read_text())
    out = [[run.name, "kept", _budget(r["budget"]), _held_in(r["kept"]), *_eval(r["eval"])]]
    if r.get("snapshot"):
        s = r["snapshot"]
        out.append(
            ["", f"kept at minute {s['minutes']:g}", _budget(s["budget"]), _held_in(s["kept"]), *_eval(s["eval"])]
        )
    if r.get("last"):
        out.append(["", "last (not kept)", "", _held_in(r["last"]["point"]), *_eval(r["last"]["eval"])])
    return ["| " + " | ".join(cells) + " |" for cells in out]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of examples/dsrl.py")
    args = ap.parse_args(argv)
    lines = [HEADER, "|" + " --- |" * HEADER.count(" | ") + " --- |"]
    for run in args.runs:
        try:
            lines += rows(run)
        except (OSError, ValueError, KeyError) as err:
            print(f"dsrl_table.py: {run}: not a finished examples/dsrl.py run ({err})", file=sys.stderr)
            return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
