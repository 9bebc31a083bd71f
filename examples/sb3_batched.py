r"""Stable-Baselines3 on the batched core: SAC (or PPO) steers the frozen policy's flow noise in N sub-envs on one graph.

    python examples/sb3_batched.py                                  # SAC, 8 sub-envs, 20k steps, 100 held-out episodes
    python examples/sb3_batched.py --algo ppo --tensorboard runs/sb3b/tb
    python examples/sb3_batched.py --envs 2 --timesteps 64 --learning-starts 16 --eval-episodes 2 --out /tmp/sb3b  # smoke

rollcap.rollout.gym.sb3.make_sb3_vec_env gives SB3 a VecEnv over gym.make_vec("rollcap/NoiseSteerPushBlock-v0", N):
each SB3 step is one round of the batched core (every sub-env's boundary, one replay of the policy graph and one of
the critic graph for all N, the chunks executed on a thread pool), not N envs each replaying its own graph. The
agent sees the state and picks each chunk's flow noise in [-noise_bound, noise_bound] (DSRL). SB3's logger prints
rollout/success_rate, every episode counted (a finished sub-env's info always holds is_success); --tensorboard DIR
also writes SB3's log as TensorBoard event files. Then the agent's deterministic noise and zero noise play the same
held-out episodes (batch 1), paired; result.json goes to --out. The agent is not saved (SB3's save pickles; see
examples/dsrl_sac.py for a SAC agent saved as safetensors).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.gym.sb3 import make_sb3_vec_env
from rollcap.rollout.learn.heldout import held_out_successes, paired_lines
from rollcap.rollout.learn.logs import sb3_logger, tensorboard_missing
from rollcap.rollout.options import Options

ENV_ID = "rollcap/NoiseSteerPushBlock-v0"


@dataclass
class Args:
    algo: Literal["sac", "ppo"] = "sac"
    """SB3's algorithm."""
    envs: int = 8
    """Sub-envs: the batch the policy and critic graphs are captured at."""
    timesteps: int = 20_000
    """SB3 steps, over all sub-envs (one step of one sub-env is one chunk)."""
    learning_starts: int = 1000
    """SAC: steps of uniformly random noise before its first update."""
    max_chunks: int = 20
    """Chunks after which an episode is cut (max_episode_steps; stop reason time_limit)."""
    noise_bound: float = 1.5
    """The agent's noise lies in [-bound, bound] (DSRL's recipe)."""
    seed: int = 0
    """SB3's seed; sub-env i trains on run seed + i."""
    eval_seed: int = 2
    """Run seed of the held-out episodes (the single env's episodes episode_seed(eval_seed, j))."""
    eval_episodes: int = 100
    """Held-out episodes, each played by the agent and by zero noise."""
    tensorboard: Path | None = None
    """Also write SB3's log as TensorBoard event files here."""
    out: Path = Path("runs/sb3_batched")
    """Where result.json goes."""


def main(args: Args) -> int:
    from stable_baselines3 import PPO, SAC

    torch.set_num_threads(1)  # SB3's updates; the policy's and critic's lanes keep their own budgets
    kw = {"state_only": True, "noise_bound": args.noise_bound}
    venv = make_sb3_vec_env(ENV_ID, n_envs=args.envs, max_episode_steps=args.max_chunks, **kw)
    try:
        if args.algo == "sac":
            model = SAC("MultiInputPolicy", venv, learning_starts=args.learning_starts, seed=args.seed, device="cpu")
        else:
            n_steps = max(2, min(256, args.timesteps // args.envs))
            model = PPO("MultiInputPolicy", venv, n_steps=n_steps, batch_size=min(64, n_steps * args.envs),
                        seed=args.seed, device="cpu")  # fmt: skip
        model.set_logger(sb3_logger(True, args.tensorboard))
        t0 = time.perf_counter()
        model.learn(args.timesteps, log_interval=max(1, args.envs) if args.algo == "sac" else 1)
        seconds = time.perf_counter() - t0
        rate = None if not model.ep_success_buffer else float(np.mean(model.ep_success_buffer))
    finally:
        venv.close()
    print(
        f"trained {model.num_timesteps} steps in {seconds:.0f} s on {args.envs} sub-envs (one graph at batch {args.envs})"
    )
    env = gym.make(ENV_ID, **kw)
    try:
        agent = held_out_successes(
            env, lambda o: model.predict(o, deterministic=True)[0], args.eval_seed, args.eval_episodes
        )
        zero = held_out_successes(env, lambda o: np.zeros(env.action_space.shape, np.float32), args.eval_seed, args.eval_episodes)  # fmt: skip
    finally:
        env.close()
    lines = paired_lines(f"{args.algo.upper()} (deterministic)", agent, "zero noise", zero, args.eval_seed)
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"args": {k: str(v) for k, v in asdict(args).items()}, "train": {"steps": int(model.num_timesteps),
              "seconds": seconds, "success_rate_last_100": rate}, "eval": {"agent": agent, "zero_noise": zero, "lines": lines}}  # fmt: skip
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
                (args.envs < 1, f"--envs: expected an integer >= 1, got {args.envs}"),
                (args.timesteps < 1, f"--timesteps: expected an integer >= 1, got {args.timesteps}"),
                (args.max_chunks < 1, f"--max-chunks: expected an integer >= 1, got {args.max_chunks}"),
                (args.eval_episodes < 1, f"--eval-episodes: expected an integer >= 1, got {args.eval_episodes}"),
                (not 0 < args.noise_bound <= 4, f"--noise-bound: expected a number in (0, 4], got {args.noise_bound}"),
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
        print(f"sb3_batched.py: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args))
