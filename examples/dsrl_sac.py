r"""DSRL: Stable-Baselines3 SAC steers a frozen policy through its flow noise (default: the shipped PushBlock one).

    python examples/dsrl_sac.py                                   # 30 min of SAC, then 200 held-out episodes
    python examples/dsrl_sac.py --timesteps 300 --learning-starts 100 --eval-episodes 5 --out /tmp/dsrl
    python examples/dsrl_sac.py --env rollcap/MetaWorld-peg-insert-side-v3 --env-kwargs '{"render_images": false}' \
        --policy policies/weights/mt10_policy.json --critic critics/weights/mt10_critic.json \
        --execute-steps 4 --env-reward-scale 0 --eval-seed 31337 --out runs/dsrl_peg   # the MT10 policy on one task

One SAC step is one 8-action chunk of the frozen policy run on the agent's
noise (rollcap's NoiseSteeringEnv, --execute-steps of them executed). The
agent sees the state, the task as a one-hot and the critic's value. After
training, its deterministic action and the frozen policy (``rollcap run`` at
the same --execute-steps) run the same held-out episode seeds; both success rates,
the paired counts, the agent's Q and how much of its noise sits at the box's edge,
and result.json go to --out with the agent (dsrl_sac.safetensors + dsrl_sac.json).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rollcap.rollout.spec import Parts
from rollcap.kernels.errors import CheckpointMismatch
from rollcap.rollout.learn.logs import tensorboard_missing
from rollcap.rollout.learn.dsrl import SteeringConfig, SteeringProbe, compare, make_steering_env, sac_entropy, train_sac
from rollcap.rollout.learn.sac_io import load_sac, save_sac
from rollcap.rollout.options import Options


@dataclass
class Args:
    timesteps: int = 100_000
    """SAC steps (one step = one chunk); training stops earlier at --max-minutes."""
    max_minutes: float = 30.0
    """Wall-clock budget of training in minutes."""
    learning_starts: int = 1000
    """Steps of uniformly random noise before SAC's first update."""
    ent_coef: str = "0.01"
    """SAC's entropy coefficient: a number, or auto (SB3 tunes it; with it the critic diverged, see BENCHMARKS.md)."""
    target_entropy: str = "auto"
    """With --ent-coef auto: the entropy SAC tunes towards (auto: minus the noise's dimension, SB3's default; DSRL's robomimic runs use 0)."""
    eval_episodes: int = 200
    """Held-out episodes, each run steered, unsteered and with zero noise."""
    seed: int = 0
    """SB3's seed and the run seed of the training episodes."""
    eval_seed: int = 2
    """Run seed of the held-out episodes (2: the seeds of BENCHMARKS.md's 70%)."""
    out: Path = Path("runs/dsrl_sac")
    """Where the agent (dsrl_sac.safetensors + .json) and result.json go."""
    load: Path | None = None
    """Evaluate this saved agent (a dsrl_sac.json or .safetensors this script wrote) instead of training one (result.json still goes to --out)."""
    tensorboard: Path | None = None
    """Also write SB3's training log as TensorBoard event files here (tensorboard --logdir DIR)."""


def main(args: Args, cfg: SteeringConfig, parts: Parts | None = None) -> None:
    if args.seed == args.eval_seed:
        raise SystemExit("--seed and --eval-seed must differ: evaluation episodes are held out from training")
    torch.set_num_threads(1)  # SAC's updates; the policy and critic lanes keep their own budgets
    env = make_steering_env(cfg, parts=parts)
    if args.load is not None:
        try:
            model, stats = load_sac(args.load, env), None
        except CheckpointMismatch as err:
            env.close()
            raise SystemExit(f"--load: {err}") from None
    args.out.mkdir(parents=True, exist_ok=True)
    if args.load is None:
        model, stats = train_sac(
            env,
            args.timesteps,
            60 * args.max_minutes,
            args.seed,
            args.learning_starts,
            args.ent_coef,
            target_entropy=args.target_entropy,
            tensorboard=args.tensorboard,
        )
        saved = save_sac(model, args.out / "dsrl_sac")
        print(f"trained {stats.steps} steps, {stats.episodes} episodes, {stats.seconds:.0f} s -> {saved}")
    probe = SteeringProbe(model, cfg.noise_bound)
    result = compare(env, probe, args.eval_seed, args.eval_episodes)
    print("\n".join(result.lines()))
    agent = probe.stats()
    print(
        f"the agent over {agent['chunks']} steered chunks: Q mean {agent['q_mean']:.3g} (5-95%: {agent['q_p5']:.3g} to {agent['q_p95']:.3g}), "
        f"{agent['saturated_fraction']:.1%} of noise elements at the box's edge"
    )
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "config": vars(cfg), "parts": {k: str(v) for k, v in vars(parts or Parts()).items()},
              "train": vars(stats) if stats else None, "eval": result.to_json(), "agent": agent}  # fmt: skip
    (args.out / "result.json").write_text(json.dumps(report, indent=1))
    env.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    opts = Options(ap)
    opts.add(Args)
    opts.add(SteeringConfig)
    opts.add(Parts, flags={"env_id": "--env"}, skip=("backend", "threads"))
    ns = ap.parse_args()
    args = Args(**opts.values(ns, Args))
    if args.tensorboard is not None and tensorboard_missing():
        ap.error(f"--tensorboard: {tensorboard_missing()}")
    try:
        sac_entropy(args.ent_coef, args.target_entropy)  # refused here, before any env is built
    except ValueError as err:
        ap.error(f"--{str(err).replace('_', '-', 1)}")
    main(args, SteeringConfig(**opts.values(ns, SteeringConfig)), Parts(**opts.values(ns, Parts)))
