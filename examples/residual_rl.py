r"""Residual RL on ChunkEnv: SB3 SAC learns a correction to the frozen policy's chunks, starting as the frozen policy.

    python examples/residual_rl.py                                   # SAC, 20k chunks, then 100 held-out episodes
    python examples/residual_rl.py --envs 8                          # the same on the batched core (one graph at batch 8)
    python examples/residual_rl.py --timesteps 40 --learning-starts 20 --eval-episodes 2 --out /tmp/res   # smoke

gym.make("rollcap/ChunkPushBlock-v0", residual=S) (with --envs N: make_sb3_vec_env(..., residual=S), the same env
on the batched core): each observation holds the policy's chunk for it (policy_chunk, computed before the agent
acts), the action is a residual in [-1, 1]^(H, A), and the env executes policy_chunk + S * action, its first
execute_steps rows (the policy's own deployment: 4 of its 8). A zero residual is the frozen policy, episode for
episode, so the agent starts as the frozen policy and explores around it. Then the agent's deterministic residual
and the zero residual (exactly the frozen policy) play the same held-out episodes, paired; --tensorboard DIR also
writes SB3's log as TensorBoard event files, and result.json goes to --out.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.gym.sb3 import make_sb3_vec_env
from rollcap.rollout.learn.heldout import SB3Run, parse_sb3_example, score_sb3, train_sb3, write_result

ENV_ID = "rollcap/ChunkPushBlock-v0"


@dataclass
class Args:
    residual: float = 0.2
    """The residual's scale S: the env executes policy_chunk + S * action, action in [-1, 1]."""
    envs: int = 1
    """1: one ChunkEnv (SB3 wraps it); N > 1: N sub-envs on one policy graph at batch N."""
    out: Path = Path("runs/residual_rl")
    """Where result.json goes."""


def main(args: Args, run: SB3Run) -> int:
    from stable_baselines3 import SAC

    torch.set_num_threads(1)  # SAC's updates; the policy's and critic's lanes keep their own budgets
    kw = {"state_only": True, "residual": args.residual, "max_episode_steps": run.max_chunks}
    env = make_sb3_vec_env(ENV_ID, n_envs=args.envs, **kw) if args.envs > 1 else gym.make(ENV_ID, **kw)
    try:
        model = SAC("MultiInputPolicy", env, learning_starts=run.learning_starts, seed=run.seed, device="cpu")
        train = train_sb3(model, run, log_interval=4)
    finally:
        env.close()
    print(f"trained {train['steps']} chunks in {train['seconds']:.0f} s ({args.envs} env(s))")
    env = gym.make(ENV_ID, **kw)
    frozen = ("frozen policy (zero residual)", lambda o: np.zeros(env.action_space.shape, np.float32))
    scored = score_sb3(model, env, "residual SAC (deterministic)", frozen, run)
    write_result(args.out, args={**asdict(args), **asdict(run)}, train=train, eval=scored)
    return 0


def problems(args: Args) -> list[str]:
    """What is wrong with this example's own flags."""
    return [msg for bad, msg in (
        (not args.residual > 0, f"--residual: expected a number > 0, got {args.residual}"),
        (args.envs < 1, f"--envs: expected an integer >= 1, got {args.envs}"),
    ) if bad]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(*parse_sb3_example(__doc__, Args, problems)))
