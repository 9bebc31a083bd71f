"""A DSRL SAC agent's networks saved and loaded without pickle.

SB3's own ``SAC.save`` writes a zip whose ``data`` entry holds cloudpickled objects, and ``SAC.load`` unpickles
them: a crafted file runs code. rollcap loads no pickle, so :func:`save_sac` writes the agent's networks (actor,
twin critics, target critics) as safetensors with a JSON config (``kernels/checkpoint.py``: digests over both files,
refused on a changed byte), and :func:`load_sac` builds a fresh ``SAC("MlpPolicy", env)`` and loads them into it,
refusing an agent made for other observation or action spaces by name. The entropy coefficient and the optimisers'
state are not kept: a loaded agent is for acting and evaluating, not for resuming training.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rollcap.kernels.checkpoint import load_weights, read_checkpoint_meta, save_checkpoint
from rollcap.kernels.errors import CheckpointMismatch

try:
    import stable_baselines3
    from stable_baselines3 import SAC
except ImportError as err:  # pragma: no cover - the rl extra is installed in CI
    raise ImportError("rollcap.rollout.learn.sac_io needs stable-baselines3: pip install 'rollcap[rl]'") from err

SAC_KIND = "dsrl-sac"


def _sac_config(obs: spaces.Box, act: spaces.Box) -> dict:
    """What the saved networks' shapes depend on: the env's spaces (SB3's MlpPolicy defaults otherwise)."""
    return {"observation_shape": list(obs.shape), "action_shape": list(act.shape),
            "action_low": float(np.min(act.low)), "action_high": float(np.max(act.high)),
            "stable_baselines3": stable_baselines3.__version__}  # fmt: skip


def save_sac(model: SAC, path: str | Path) -> Path:
    """The agent's networks (actor, critics, target critics) to ``<path>.safetensors`` + ``<path>.json``; the json path."""
    return save_checkpoint(model.policy, _sac_config(model.observation_space, model.action_space), path, SAC_KIND)


def load_sac(path: str | Path, env: gym.Env) -> SAC:
    """A SAC agent for ``env`` with the networks :func:`save_sac` wrote; nothing is unpickled.

    Raises:
        CheckpointMismatch: one line naming the file: not a DSRL SAC checkpoint, damaged, or made for an env with
            other observation or action spaces.
    """
    if Path(path).suffix == ".zip":
        raise CheckpointMismatch(
            f"{path}: an SB3 zip, which rollcap does not load (SAC.load unpickles it); "
            "give the dsrl_sac.json that examples/dsrl_sac.py writes"
        )
    meta = read_checkpoint_meta(path, SAC_KIND)
    want, have = _sac_config(env.observation_space, env.action_space), meta["config"]
    for key in ("observation_shape", "action_shape", "action_low", "action_high"):
        if have.get(key) != want[key]:
            raise CheckpointMismatch(
                f"{Path(path).with_suffix('.json')}: {key} {have.get(key)!r}, this env's is {want[key]!r}; "
                "it was trained with another --env or steering config"
            )
    model = SAC("MlpPolicy", env, device="cpu")
    load_weights(model.policy, path, meta["weights_digest"])
    return model
