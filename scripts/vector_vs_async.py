"""Interleaved rounds: the batched NoiseSteeringVectorEnv (8 sub-envs, one graph) vs AsyncVectorEnv(2, spawn).

The same two measurements as ``rollcap bench --only batch``'s vector rows (40 chunks each, the shipped
policy and critic on CPU), repeated ``--rounds`` times in alternation so a busy machine's swings land on
both sides of each ratio. Prints one line per round and the spread of the ratio::

    nice -n 10 python3 scripts/vector_vs_async.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import time

from rollcap.rollout.bench.batch import _vector_rate as batched_rate
from rollcap.rollout.bench.gym import _vector_rate as async_rate
from rollcap.rollout.spec import Parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--envs", type=int, default=8)
    args = ap.parse_args()
    parts = Parts()
    rows = []
    for k in range(args.rounds):
        load = os.getloadavg()[0]
        a = async_rate(parts, 2, args.chunks)
        b = batched_rate(parts, args.envs, args.chunks)
        rows.append({"round": k, "async_2": a, "batched": b, "ratio": b / a, "load_1min": load})
        print(json.dumps(rows[-1]), flush=True)
    ratios = sorted(r["ratio"] for r in rows)
    print(
        f"batched {args.envs} sub-envs / AsyncVectorEnv(2): {ratios[0]:.2f}-{ratios[-1]:.2f}x over {len(rows)} rounds "
        f"(median {ratios[len(ratios) // 2]:.2f}x); at {time.strftime('%H:%M')} UTC, load {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
