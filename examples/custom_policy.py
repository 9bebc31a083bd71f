"""Your own env and policy under rollcap: a gymnasium MuJoCo env and a plain eager nn.Module.

    python examples/custom_policy.py --episodes 3 --out runs/custom

The policy needs four methods (rollcap.ChunkPolicy); no capture, no lane, no
critic. The env gets exact state from rollcap.make_env, so every episode is
recorded with what it takes to replay it, and the script proves it does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import rollcap
from rollcap.kernels.fingerprint import device_fingerprint, tensor_digest
from rollcap.rollout.offline.replay import replay_env, replay_policy


class LinearChunkPolicy:
    """An eager nn.Module behind rollcap's ChunkPolicy protocol: observation + noise -> an [H, A] chunk."""

    def __init__(self, obs_dim: int, action_dim: int, horizon: int = 4, seed: int = 0):
        torch.manual_seed(seed)
        self.net = torch.nn.Linear(obs_dim, horizon * action_dim).eval()
        self.chunk_shape = (horizon, action_dim)
        self._chunk: np.ndarray | None = None

    def reset(self) -> None:
        self._chunk = None

    def start(self, obs, noise: np.ndarray) -> None:
        with torch.no_grad():
            mean = self.net(torch.as_tensor(obs, dtype=torch.float32)).reshape(self.chunk_shape)
        self._chunk = (torch.tanh(mean).numpy() + 0.05 * noise).astype(np.float32)

    def result(self) -> np.ndarray:
        return self._chunk

    def state_fingerprint(self) -> dict:
        return {**device_fingerprint("cpu"), "weights_digest": tensor_digest(self.net.state_dict())}


@dataclass
class Args:
    episodes: int = 3
    out: Path = Path("runs/custom")
    env: str = "InvertedPendulum-v5"


def main(args: Args) -> None:
    env = rollcap.make_env(args.env)
    policy = LinearChunkPolicy(env.observation_space.shape[0], env.action_space.shape[0])
    result = rollcap.run(args.episodes, out=args.out, env=env, policy=policy, progress=False)
    print(result.summary["stop_reasons"], "->", result.run_dir)
    for rec in result.records():
        print(
            f"episode {rec.index}: policy replay {replay_policy(rec, policy).status}, env replay {replay_env(rec, env).status}"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=Args.episodes)
    ap.add_argument("--out", type=Path, default=Args.out)
    ap.add_argument("--env", default=Args.env)
    main(Args(**vars(ap.parse_args())))
