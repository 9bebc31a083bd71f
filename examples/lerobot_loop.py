"""The LeRobot loop, end to end: DART-style expert demonstrations -> LeRobotDataset v3 -> lerobot-train (a small ACT)
-> rollcap run with the shipped critic -> replay exact -> inspect --plot.

The demonstrations are DART-style: the scripted expert executes with Gaussian
noise (`--policy expert:NOISE`, the noise from the host, so they replay exactly)
and the export labels every frame with the *clean* expert's action on that
frame's observation (`rollcap export --labels expert`): the dataset shows how to
recover from states off the expert's path, with labels free of the noise.

Run it with LeRobot's venv (Python >= 3.12; `bash scripts/lerobot_env.sh` builds it):

    .venv-lerobot/bin/python examples/lerobot_loop.py --out runs/loop

Every stage is a `rollcap` / `lerobot-train` command; the script only strings
them together and prints each. The defaults are those of the checkpoint in
examples/lerobot_act/ (BENCHMARKS.md, "LeRobot"); `--demos 4 --steps 2
--episodes 2` is the smoke test's budget.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass
class Args:
    out: Path = Path("runs/lerobot_loop")
    """Directory for the demos, the dataset, the training run and the evaluation run."""
    demos: int = 1000
    """Expert episodes recorded (`--policy expert:NOISE`: the scripted expert with Gaussian action noise from the host's noise)."""
    noise: float = 0.3
    """Std of the expert's executed action noise (the labels are the clean expert's)."""
    steps: int = 12000
    """lerobot-train steps."""
    episodes: int = 20
    """Evaluation episodes under rollcap's host with the shipped critic."""
    seed: int = 101
    """Run seed of the demonstrations (the evaluation uses seed + 1)."""


ACT = (  # a small ACT without images: state + the instruction as a 32-dim hashed bag of words (174K parameters, 0.7 MB)
    "--policy.type=act",
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--policy.pretrained_backbone_weights=null",
    "--policy.chunk_size=8",
    "--policy.n_action_steps=4",
    "--policy.dim_model=64",
    "--policy.n_heads=4",
    "--policy.dim_feedforward=256",
    "--policy.n_encoder_layers=2",
    "--policy.n_decoder_layers=1",
    "--policy.use_vae=false",
    "--policy.optimizer_lr=5e-4",
)


def sh(*cmd) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


def main(args: Args) -> None:
    rollcap = (sys.executable, "-m", "rollcap.rollout.cli")
    out = args.out
    sh(
        *rollcap,
        "run",
        "--policy",
        f"expert:{args.noise}",
        "--critic",
        "none",
        "--episodes",
        args.demos,
        "--seed",
        args.seed,
        "--format",
        "npz",
        "--out",
        out / "demos",
    )
    sh(
        *rollcap,
        "export",
        out / "demos",
        "--to",
        "lerobot",
        "--root",
        out / "dataset",
        "--obs-keys",
        "state",
        "--instruction-dims",
        "32",
        "--extras",
        "",
        "--labels",
        "expert",
    )
    sh(
        Path(sys.executable).with_name("lerobot-train"),
        "--dataset.repo_id=rollcap/dataset",
        f"--dataset.root={out / 'dataset'}",
        *ACT,
        f"--steps={args.steps}",
        "--batch_size=32",
        "--num_workers=0",
        f"--save_freq={args.steps}",
        "--log_freq=200",
        "--seed=1000",
        "--wandb.enable=false",
        f"--output_dir={out / 'train'}",
    )
    policy = f"lerobot:{out / 'train' / 'checkpoints' / 'last' / 'pretrained_model'}"
    sh(*rollcap, "run", "--policy", policy, "--episodes", args.episodes, "--seed", args.seed + 1, "--out", out / "eval")
    sh(*rollcap, "replay", out / "eval", "--policy", policy)
    sh(*rollcap, "inspect", out / "eval", "--plot", out / "eval" / "plots")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in fields(Args):
        ap.add_argument("--" + f.name, type=type(f.default), default=f.default)
    main(Args(**vars(ap.parse_args())))
