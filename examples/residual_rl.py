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

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.gym.sb3 import make_sb3_vec_env
from rollcap.rollout.learn.heldout import held_out_successes, paired_lines
from rollcap.rollout.learn.logs import sb3_logger, tensorboard_missing
from rollcap.rollout.options import Options

ENV_ID = "rollcap/ChunkPushBlock-v0"


@dataclass
class Args:
    residual: float = 0.2
    """The residual's scale S: the env executes policy_chunk + S * action, action in [-1, 1]."""
    envs: int = 1
    """1: one ChunkEnv (SB3 wraps it); N > 1: N sub-envs on one policy graph at batch N."""
    timesteps: int = 20_000
    """SAC steps, over all sub-envs (one step is one chunk)."""
    learning_starts: int = 1000
    """Steps of uniformly random residuals before SAC's first update."""
    max_chunks: int = 25
    """Chunks after which an episode is cut (max_episode_steps; stop reason time_limit)."""
    seed: int = 0
    """SB3's seed and the training episodes' run seed."""
    eval_seed: int = 2
    """Run seed of the held-out episodes (episode_seed(eval_seed, j))."""
    eval_episodes: int = 100
    """Held-out episodes, each played by the agent and by the frozen policy (zero residual)."""
    tensorboard: Path | None = None
    """Also write SB3's log as TensorBoard event files here."""
    out: Path = Path("runs/residual_rl")
    """Where result.json goes."""


def main(args: Args) -> int:
    from stable_baselines3 import SAC

    torch.set_num_threads(1)  # SAC's updates; the policy's and critic's lanes keep their own budgets
    kw = {"state_only": True, "residual": args.residual, "max_episode_steps": args.max_chunks}
    if args.envs > 1:
        env = make_sb3_vec_env(ENV_ID, n_envs=args.envs, **kw)
    else:
        env = gym.make(ENV_ID, **kw)
    try:
        model = SAC("MultiInputPolicy", env, learning_starts=args.learning_starts, seed=args.seed, device="cpu")
        model.set_logger(sb3_logger(True, args.tensorboard))
        t0 = time.perf_counter()
        model.learn(args.timesteps, log_interval=4)
        seconds = time.perf_counter() - t0
        rate = None if not model.ep_success_buffer else float(np.mean(model.ep_success_buffer))
    finally:
        env.close()
    print(f"trained {model.num_timesteps} chunks in {seconds:.0f} s ({args.envs} env(s))")
    env = gym.make(ENV_ID, **kw)
    try:
        agent = held_out_successes(
            env, lambda o: model.predict(o, deterministic=True)[0], args.eval_seed, args.eval_episodes
        )
        frozen = held_out_successes(env, lambda o: np.zeros(env.action_space.shape, np.float32), args.eval_seed, args.eval_episodes)  # fmt: skip
    finally:
        env.close()
    lines = paired_lines("residual SAC (deterministic)", agent, "frozen policy (zero residual)", frozen, args.eval_seed)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"args": {k: str(v) for k, v in asdict(args).items()}, "train": {"steps": int(model.num_timesteps),
              "seconds": seconds, "success_rate_last_100": rate}, "eval": {"agent": agent, "frozen": frozen, "lines": lines}}  # fmt: skip
    (args.out / "result.json").write_text(json.dumps(report, indent=1))
    print(f"-> {args.out / 'result.json'}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    opts = Options(ap)
    opts.add(Args)
    args = Args(**opts.values(ap.parse_args(), Args))
    problem = next(
        (
            msg
            for bad, msg in (
                (not args.residual > 0, f"--residual: expected a number > 0, got {args.residual}"),
                (args.envs < 1, f"--envs: expected an integer >= 1, got {args.envs}"),
                (args.timesteps < 1, f"--timesteps: expected an integer >= 1, got {args.timesteps}"),
                (args.max_chunks < 1, f"--max-chunks: expected an integer >= 1, got {args.max_chunks}"),
                (args.eval_episodes < 1, f"--eval-episodes: expected an integer >= 1, got {args.eval_episodes}"),
                (
                    args.tensorboard is not None and bool(tensorboard_missing()),
                    f"--tensorboard: {tensorboard_missing()}",
                ),
            )
            if bad
        ),
        None,
    )
    if problem is not None:  # one line, exit 2, nothing built
        print(f"residual_rl.py: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args))
