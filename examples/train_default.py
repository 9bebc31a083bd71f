"""Train and write the default PushBlock policy + critic (the shipped checkpoints).

python examples/train_default.py                   # full run, writes policies/weights and critics/weights
python examples/train_default.py --demos 4 --policy-steps 5 --critic-steps 5 --eval-episodes 2 --out /tmp/w
python examples/train_default.py --shared-prefix --out runs/shared   # the guidance branches share the observation's prefix
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

from rollcap.critics import DEFAULT_CHECKPOINT as CRITIC
from rollcap.policies import DEFAULT_CHECKPOINT as POLICY
from rollcap.rollout.learn.training import TrainConfig, evaluate_checkpoints, train_default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    numeric = [f for f in fields(TrainConfig) if f.type in ("int", "float")]
    for f in numeric:
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float, default=f.default)
    ap.add_argument(
        "--eval-only", action="store_true", help="only re-evaluate the checkpoints (refreshes training_report.json)"
    )
    ap.add_argument(
        "--shared-prefix",
        action="store_true",
        help="train the policy with FlowVLAConfig.shared_prefix (the observation does not attend to the advantage token)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write both checkpoints into this directory instead of the shipped locations",
    )
    args = ap.parse_args()
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in numeric})
    if args.shared_prefix:
        cfg = replace(cfg, policy=replace(cfg.policy, shared_prefix=True))
    policy, critic = (POLICY, CRITIC) if args.out is None else (args.out / POLICY.name, args.out / CRITIC.name)
    if args.eval_only:
        evaluate_checkpoints(cfg, policy, critic)
    else:
        train_default(cfg, policy, critic)


if __name__ == "__main__":
    main()
