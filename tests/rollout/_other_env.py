"""Recordings of an env the shipped models cannot read: gymnasium's InvertedPendulum-v5 with a linear chunk policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class LinearPolicy:
    """``rollcap.ChunkPolicy`` over a flat observation: a fixed linear map, tanh, plus a little noise."""

    def __init__(self, obs_dim: int, action_dim: int, horizon: int = 4):
        self.w = np.random.default_rng(0).standard_normal((horizon * action_dim, obs_dim)).astype(np.float32) * 0.1
        self.chunk_shape = (horizon, action_dim)
        self.chunk = None

    def reset(self) -> None:
        self.chunk = None

    def start(self, obs, noise) -> None:
        self.chunk = (np.tanh(self.w @ np.asarray(obs, np.float32)).reshape(self.chunk_shape) + 0.05 * noise).astype(
            np.float32
        )

    def result(self):
        return self.chunk

    def state_fingerprint(self) -> dict:
        return {"policy": "LinearPolicy", "weights_digest": "linear-0"}


def record_inverted_pendulum(out: Path, episodes: int = 2) -> Path:
    """``episodes`` short episodes of InvertedPendulum-v5 (a TimeLimit, no image, no instruction) recorded in ``out``."""
    import rollcap

    env = rollcap.make_env("InvertedPendulum-v5")
    try:
        rollcap.run(
            episodes,
            out=out,
            env=env,
            policy=LinearPolicy(env.observation_space.shape[0], env.action_space.shape[0]),
            progress=False,
            max_chunks=3,
        )
    finally:
        env.close()
    return Path(out)
