r"""REINFORCE on the batched vector env: a linear Gaussian agent steers the frozen policy's flow noise in N sub-envs at once.

    python examples/vector_noise_pg.py                                  # 8 sub-envs, 30 updates of 8 chunks each
    python examples/vector_noise_pg.py --envs 2 --updates 2 --chunks 2  # a smoke run

One vector step is one chunk in every sub-env: rollcap's NoiseSteeringVectorEnv
runs the shipped policy once at batch N on the agent's noise and executes the
N chunks (gymnasium 1.x next-step autoreset). The agent maps the proprio state
to the mean of the noise; returns are summed per episode within the rollout
(an autoreset step, reward 0, cuts them). Prints the mean chunk reward and the
episodes that ended (and succeeded) per update; --tensorboard DIR also writes
them as TensorBoard event files.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rollcap.rollout.learn.logs import add_scalars, summary_writer, tensorboard_missing
from rollcap.rollout.options import Options
from rollcap.rollout.gym.vector import make_noise_steering_vector_env


@dataclass
class Args:
    envs: int = 8
    """Sub-envs: the batch the policy and critic graphs are captured at."""
    updates: int = 30
    """Policy-gradient updates."""
    chunks: int = 8
    """Vector steps (chunks per sub-env) per update."""
    std: float = 0.5
    """The agent's noise standard deviation around its mean."""
    lr: float = 0.01
    """Adam's learning rate."""
    seed: int = 0
    """Seed of the sub-envs (sub-env i: seed + i) and of the agent."""
    threads: int = 1
    """Intra-op threads of the policy's and the critic's lanes."""
    tensorboard: Path | None = None
    """Also write each update's figures as TensorBoard event files here."""


def main(args: Args) -> None:
    torch.manual_seed(args.seed)
    env = make_noise_steering_vector_env(args.envs, threads=args.threads)
    h, a = env.chunk_shape
    agent = torch.nn.Linear(env.single_observation_space["state"].shape[0], h * a)
    torch.nn.init.zeros_(agent.weight)
    torch.nn.init.zeros_(agent.bias)
    opt = torch.optim.Adam(agent.parameters(), lr=args.lr)
    obs, _ = env.reset(seed=args.seed)
    writer = summary_writer(args.tensorboard) if args.tensorboard is not None else None
    try:
        for update in range(args.updates):
            logps, rewards, cuts, ended, successes = [], [], [], 0, 0
            for _ in range(args.chunks):
                dist = torch.distributions.Normal(agent(torch.as_tensor(obs["state"])), args.std)
                x = dist.sample()
                obs, r, term, trunc, info = env.step(x.view(args.envs, h, a).numpy())
                logps.append(dist.log_prob(x).sum(-1))
                rewards.append(torch.as_tensor(r, dtype=torch.float32))
                done = term | trunc
                cuts.append(torch.as_tensor(done, dtype=torch.float32))
                ended += int(done.sum())
                successes += int(
                    np.sum(
                        info.get("is_success", np.zeros(args.envs, bool))
                        & info.get("_is_success", np.zeros(args.envs, bool))
                    )
                )
            returns, g = [], torch.zeros(args.envs)
            for r, cut in zip(reversed(rewards), reversed(cuts)):
                g = r + g * (1.0 - cut)
                returns.append(g)
            returns = torch.stack(returns[::-1])
            loss = -(torch.stack(logps) * (returns - returns.mean())).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = float(torch.stack(rewards).mean())
            print(f"update {update:>3}: mean chunk reward {mean:+.4f}, episodes ended {ended} (succeeded {successes})")
            if writer is not None:
                figures = {"mean_chunk_reward": mean, "episodes_ended": ended, "episodes_succeeded": successes}
                add_scalars(writer, "train", figures, (update + 1) * args.chunks * args.envs)
    finally:
        env.close()
        if writer is not None:
            writer.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    opts = Options(ap)
    opts.add(Args)
    args = Args(**opts.values(ap.parse_args(), Args))
    if args.envs < 1:  # one line, exit 2, nothing built
        print(f"vector_noise_pg.py: --envs: expected an integer >= 1, got {args.envs}", file=sys.stderr)
        sys.exit(2)
    if args.tensorboard is not None and tensorboard_missing():
        print(f"vector_noise_pg.py: --tensorboard: {tensorboard_missing()}", file=sys.stderr)
        sys.exit(2)
    main(args)
