r"""A CleanRL-style loop over the batched vector env that records every episode it plays; `rollcap replay` checks them.

    python examples/record_vector_loop.py --out runs/rl-loop     # 4 sub-envs, 4 updates of 8 chunks
    rollcap replay runs/rl-loop                                  # exit 0: policy and env exact; closed: not comparable

``gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs=N, subscribers=(recorder,))``: the shipped policy at batch
N, steered through its flow noise (bounded to ``--noise-bound``, the agent seeing the state only), each episode cut
after ``--max-chunks`` chunks (stop reason ``time_limit``), gymnasium's ``RecordEpisodeStatistics`` on top. The agent
is a linear Gaussian policy on the state, trained by REINFORCE on the chunk rewards. Every episode any sub-env
finishes is recorded (npz + HDF5) under its own index with the seed it used; ``close()`` closes the recorder. A
closed-loop replay cannot know the noise the agent chose, so `rollcap replay` says "not comparable: actions came from
the caller" for that mode and passes when the modes that apply (policy, env) are exact.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.cli.options import Options
from rollcap.rollout.recording import EpisodeRecorder


@dataclass
class Args:
    out: str = "runs/rl-loop"
    """Run directory the episodes are recorded in (must not hold episodes yet)."""
    envs: int = 4
    """Sub-envs (the batch the policy graph is captured at)."""
    updates: int = 4
    """Policy-gradient updates."""
    chunks: int = 8
    """Vector steps (chunks per sub-env) per update."""
    max_chunks: int = 6
    """Chunks after which an episode is cut (gymnasium's max_episode_steps; stop reason time_limit)."""
    noise_bound: float = 1.5
    """The agent's noise lies in [-bound, bound] (DSRL's recipe)."""
    seed: int = 0
    """Seed of the sub-envs (sub-env i: run seed + i) and of the agent."""


def main(args: Args) -> int:
    torch.manual_seed(args.seed)
    recorder = EpisodeRecorder(args.out)
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.make_vec(
            "rollcap/NoiseSteerPushBlock-v0",
            num_envs=args.envs,
            noise_bound=args.noise_bound,
            state_only=True,
            max_episode_steps=args.max_chunks,
            subscribers=(recorder,),
        )
    )
    h, a = env.single_action_space.shape
    agent = torch.nn.Linear(env.single_observation_space["state"].shape[0], h * a)
    torch.nn.init.zeros_(agent.weight)
    torch.nn.init.zeros_(agent.bias)
    opt = torch.optim.Adam(agent.parameters(), lr=0.01)
    obs, _ = env.reset(seed=args.seed)
    try:
        for update in range(args.updates):
            logps, rewards, cuts, returns_seen = [], [], [], []
            for _ in range(args.chunks):
                dist = torch.distributions.Normal(agent(torch.as_tensor(obs["state"])), 0.5)
                x = dist.sample()
                obs, r, term, trunc, info = env.step(x.view(args.envs, h, a).numpy())
                logps.append(dist.log_prob(x).sum(-1))
                rewards.append(torch.as_tensor(r, dtype=torch.float32))
                cuts.append(torch.as_tensor(term | trunc, dtype=torch.float32))
                if "episode" in info:  # RecordEpisodeStatistics: the episodes that ended this step
                    returns_seen += info["episode"]["r"][info["_episode"]].tolist()
            returns, g = [], torch.zeros(args.envs)
            for r, cut in zip(reversed(rewards), reversed(cuts)):
                g = r + g * (1.0 - cut)
                returns.append(g)
            returns = torch.stack(returns[::-1])
            loss = -(torch.stack(logps) * (returns - returns.mean())).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = f"{np.mean(returns_seen):+.3f}" if returns_seen else "n/a"
            print(f"update {update}: {len(returns_seen)} episode(s) ended, mean return {mean}")
    finally:
        env.close()  # abandons the running episodes, closes the recorder
    print(f"recorded {len(recorder.indices)} episode(s) in {args.out}; check them: rollcap replay {args.out}")
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
                (args.max_chunks < 1, f"--max-chunks: expected an integer >= 1, got {args.max_chunks}"),
                (not 0 < args.noise_bound <= 4, f"--noise-bound: expected a number in (0, 4], got {args.noise_bound}"),
                (Path(args.out).exists(), f"--out {args.out}: already exists; pick a new run directory"),
            )
            if bad
        ),
        None,
    )
    if problem is not None:  # one line, exit 2, nothing created
        print(f"record_vector_loop.py: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args))
