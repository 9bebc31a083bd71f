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

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.gym.sb3 import make_sb3_vec_env
from rollcap.rollout.learn.heldout import SB3Run, parse_sb3_example, score_sb3, train_sb3, write_result

ENV_ID = "rollcap/NoiseSteerPushBlock-v0"


@dataclass
class Args:
    algo: Literal["sac", "ppo"] = "sac"
    """SB3's algorithm."""
    envs: int = 8
    """Sub-envs: the batch the policy and critic graphs are captured at."""
    noise_bound: float = 1.5
    """The agent's noise lies in [-bound, bound] (DSRL's recipe)."""
    out: Path = Path("runs/sb3_batched")
    """Where result.json goes."""


def main(args: Args, run: SB3Run) -> int:
    from stable_baselines3 import PPO, SAC

    torch.set_num_threads(1)  # SB3's updates; the policy's and critic's lanes keep their own budgets
    kw = {"state_only": True, "noise_bound": args.noise_bound}
    venv = make_sb3_vec_env(ENV_ID, n_envs=args.envs, max_episode_steps=run.max_chunks, **kw)
    try:
        if args.algo == "sac":
            model = SAC("MultiInputPolicy", venv, learning_starts=run.learning_starts, seed=run.seed, device="cpu")
        else:
            n_steps = max(2, min(256, run.timesteps // args.envs))
            model = PPO("MultiInputPolicy", venv, n_steps=n_steps, batch_size=min(64, n_steps * args.envs),
                        seed=run.seed, device="cpu")  # fmt: skip
        train = train_sb3(model, run, log_interval=args.envs if args.algo == "sac" else 1)
    finally:
        venv.close()
    print(
        f"trained {train['steps']} steps in {train['seconds']:.0f} s on {args.envs} sub-envs (one graph at batch {args.envs})"
    )
    env = gym.make(ENV_ID, **kw)
    zero = ("zero noise", lambda o: np.zeros(env.action_space.shape, np.float32))
    scored = score_sb3(model, env, f"{args.algo.upper()} (deterministic)", zero, run)
    write_result(args.out, args={**asdict(args), **asdict(run)}, train=train, eval=scored)
    return 0


def problems(args: Args) -> list[str]:
    """What is wrong with this example's own flags."""
    return [msg for bad, msg in (
        (args.envs < 1, f"--envs: expected an integer >= 1, got {args.envs}"),
        (not 0 < args.noise_bound <= 4, f"--noise-bound: expected a number in (0, 4], got {args.noise_bound}"),
    ) if bad]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(*parse_sb3_example(__doc__, Args, problems)))
