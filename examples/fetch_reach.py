"""gymnasium-robotics' FetchReach under rollcap, driven by a scripted policy of your own.

    python examples/fetch_reach.py --episodes 3 --out runs/fetch
    rollcap replay runs/fetch --env gymnasium_robotics:FetchReach-v4 --mode env

No shipped policy reads Fetch's observations (``observation``,
``achieved_goal``, ``desired_goal``); this one does: it moves the gripper
towards the goal (a proportional step, gripper still) plus a little of the
host's noise, so every episode is a pure function of its seed.
``rollcap.make_env`` builds the env with exact state (the goal included), so
the recording replays exactly, and the script proves it does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import rollcap
from rollcap.rollout.offline.replay import replay_env, replay_policy


class ReachPolicy:
    """rollcap's ChunkPolicy for FetchReach: a one-action chunk ``gain x (goal - gripper)`` plus ``std x noise``."""

    def __init__(self, gain: float = 10.0, std: float = 0.05):
        self.gain, self.std = float(gain), float(std)
        self.chunk_shape = (1, 4)
        self._chunk: np.ndarray | None = None

    def reset(self) -> None:
        self._chunk = None

    def start(self, obs, noise: np.ndarray) -> None:
        step = self.gain * (np.asarray(obs["desired_goal"]) - np.asarray(obs["achieved_goal"]))
        action = np.append(step, 0.0) + self.std * np.asarray(noise[0], np.float64)
        self._chunk = np.clip(action, -1.0, 1.0).astype(np.float32)[None]

    def result(self) -> np.ndarray:
        return self._chunk

    def state_fingerprint(self) -> dict:
        return {"kind": "examples.fetch_reach", "gain": self.gain, "std": self.std, "numpy": np.__version__}


@dataclass
class Args:
    episodes: int = 3
    out: Path = Path("runs/fetch")
    env: str = "gymnasium_robotics:FetchReach-v4"


def main(args: Args) -> None:
    env = rollcap.make_env(args.env)
    policy = ReachPolicy()
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
