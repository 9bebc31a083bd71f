r"""Exactness of an examples/flow_rl.py run: random training episodes replay exactly in a fresh process with the
weights they name, every recorded group started byte-identical, and the capture count.

    python scripts/flow_rl_exact.py runs/flow/push-0 --episodes 3 --seed 0

For each of ``--episodes`` recorded episodes drawn at random (``--seed``), ``rollcap replay EPISODE --policy W`` runs
in a new process, W the checkpoint of the weights digest the episode's fingerprint names (``weights/``); its
summary line is printed. Then, for every recorded iteration, the episodes of each group (``--group-size`` of them,
slot order) are checked to have the same initial state and first observation, byte for byte, and different noise.
Exit 0 when everything holds.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np

from rollcap.rollout.learn.flow_rl import find_weights
from rollcap.rollout.protocols import observation_at
from rollcap.rollout.recording import read_npz


def replay(run: Path, index: int) -> tuple[bool, str]:
    path = run / "episodes" / f"episode_{index:05d}.npz"
    rec = read_npz(path)
    digest = rec.fingerprints["policy"]["weights_digest"]
    weights = find_weights(run, digest)
    if weights is None:
        return False, f"episode {index}: no checkpoint of its weights {digest[:19]} in {run / 'weights'}"
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(path), "--policy", str(weights)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    last = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    return out.returncode == 0 and "all exact" in last, f"episode {index} (weights {digest[:19]}): {last}"


def groups_identical(run: Path, indices: list[int], size: int) -> tuple[int, list[str]]:
    bad, n = [], 0
    for lo in range(0, len(indices), size):
        recs = [read_npz(run / "episodes" / f"episode_{i:05d}.npz") for i in indices[lo : lo + size]]
        n += 1
        first = recs[0]
        for r in recs[1:]:
            same = all(r.initial_state[k].tobytes() == first.initial_state[k].tobytes() for k in first.initial_state)
            o0, o1 = observation_at(first, 0), observation_at(r, 0)
            same &= all(np.asarray(o0[k]).tobytes() == np.asarray(o1[k]).tobytes() for k in o0 if k != "instruction")
            if not same or r.chunks["noise"][0].tobytes() == first.chunks["noise"][0].tobytes():
                bad.append(f"group of episodes {indices[lo : lo + size]}: episode {r.index} differs from {first.index}")
    return n, bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    result = json.loads((a.run / "result.json").read_text())
    recorded = result["recorded"]
    size = result["config"]["group_size"]
    every = [i for _, indices, _, _ in recorded for i in indices]
    ok = True
    for index in sorted(random.Random(a.seed).sample(every, min(a.episodes, len(every)))):
        good, line = replay(a.run, index)
        ok &= good
        print(line, flush=True)
    n, bad = 0, []
    for _, indices, _, _ in recorded:
        k, b = groups_identical(a.run, indices, size)
        n, bad = n + k, bad + b
    print(
        f"{n} recorded groups of {size}: "
        + ("every one started byte-identical, with its own noise" if not bad else f"{len(bad)} not")
    )
    for line in bad[:5]:
        print("  " + line)
    cap = result["budget"]["capture_count"]
    print(
        f"capture count: {cap['graphs']} graphs captured at the start, {cap['captures_during_training']} during training"
    )
    return 0 if ok and not bad and cap["captures_during_training"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
