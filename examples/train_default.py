"""Train and write the default PushBlock policy + critic (the shipped checkpoint).

    python examples/train_default.py                # full run, ~10 min on 2 cores
    python examples/train_default.py --demos 4 --policy-steps 5 --critic-steps 5 --eval-episodes 2 --out /tmp/w
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from rollcap.rollout.training import TrainConfig, train_default

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "policies" / "weights"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(TrainConfig):
        if f.type in ("int", "float"):
            ap.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float, default=f.default)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the weights go (default: the shipped location)")
    args = ap.parse_args()
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.type in ("int", "float")})
    train_default(cfg, args.out)


if __name__ == "__main__":
    main()
