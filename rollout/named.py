"""Policies named by a word instead of a checkpoint of ours: ``expert[:STD]`` and ``lerobot:DIR``.

:func:`named_runner` is what :func:`rollcap.rollout.build.runners` builds for such a name: an
:class:`ExpertPolicy` (an env's scripted expert as a chunk policy) or a
:class:`~rollcap.policies.lerobot.LeRobotPolicy`. Their names are checked when a
spec is made (:func:`rollcap.rollout.spec.named_policy`, :func:`~rollcap.rollout.spec.expert_std`); a LeRobot
directory and lerobot itself when one is built (:func:`check_lerobot`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rollcap.envs.experts import PushBlockScript, scripted_expert
from rollcap.kernels.graph import default_backend
from rollcap.policies.lerobot_features import BACKENDS as LEROBOT_BACKENDS, map_features
from rollcap.policies.lerobot import LeRobotPolicy
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.spec import LEROBOT_PREFIX, Parts, expert_std, named_policy


def check_lerobot(directory: str) -> None:
    """Refuse ``lerobot:DIR`` where DIR holds no saved LeRobot policy or lerobot cannot be imported here (a
    ConfigError naming ``policy``; what :func:`rollcap.rollout.build.probe` checks before anything is loaded)."""
    if not (Path(directory) / "config.json").is_file():
        raise ConfigError(
            "policy",
            f"{LEROBOT_PREFIX}{directory}: {directory} holds no config.json; expected a LeRobot policy's save_pretrained directory (lerobot-train's checkpoints/last/pretrained_model)",
        )
    if importlib.util.find_spec("lerobot") is None:
        raise ConfigError(
            "policy",
            f"{LEROBOT_PREFIX}{directory}: lerobot is not importable in this Python ({sys.version.split()[0]}); build LeRobot's venv with `bash scripts/lerobot_env.sh` and run rollcap from it",
        )


def named_runner(parts: Parts, env=None):
    """The policy ``parts.policy`` names when it is not a checkpoint of ours (``lerobot:DIR``, ``expert[:STD]``), else None."""
    named = named_policy(parts.policy)
    if named is None:
        return None
    kind, arg = named
    if kind == "expert":
        return expert_policy(arg, env)
    backend = parts.backend or "eager"  # the default: every LeRobot recording before capture existed was eager
    if backend not in LEROBOT_BACKENDS or (backend != "eager" and backend != default_backend(parts.device)):
        raise ConfigError(
            "backend",
            f"{backend!r}: a LeRobot policy on {parts.device} runs 'eager' or {default_backend(parts.device)!r} ({LEROBOT_PREFIX}{arg})",
        )
    # it runs on the host's thread: torch's default (every core) measured 168 ms vs 1.5 ms a chunk beside a busy core
    torch.set_num_threads(parts.threads)
    try:
        policy = LeRobotPolicy.load(arg, device=parts.device, backend=backend, threads=parts.threads)
        if env is not None and isinstance(env.observation_space, gym.spaces.Dict):
            map_features(policy.cfg.input_features, list(env.observation_space.spaces))
    except (ValueError, ImportError) as err:
        raise ConfigError("policy", f"{LEROBOT_PREFIX}{arg}: {str(err).splitlines()[0]}") from err
    return policy


def expert_policy(name: str, env=None, env_id: str | None = None) -> ExpertPolicy:
    """``expert[:STD]`` for ``env`` (or the env with id ``env_id``, what a recording names; neither: the built-in task).

    Raises:
        ConfigError: (field ``policy``) the env has no scripted expert (:func:`rollcap.envs.experts.scripted_expert`).
    """
    std = ExpertPolicy.parse(name)
    try:
        return ExpertPolicy(std, scripted_expert(env, env_id))
    except ValueError as err:
        raise ConfigError("policy", f"{name}: {err}") from err


class ExpertPolicy:
    """An env's scripted expert as a :class:`~rollcap.rollout.protocols.ChunkPolicy` (``--policy expert``).

    The script (:mod:`rollcap.envs.experts`: the built-in task's, or a MetaWorld
    task's from ``metaworld.policies``) is reactive: a chunk of one action per
    boundary, read from the current observation. ``std`` > 0 adds ``std x``
    the host's noise to that action (DART-style exploration, clipped to
    [-1, 1]), so a noisy demo is still a pure function of the episode seed and
    replays exactly. Single caller: the host's thread.
    """

    execute_steps = 1

    def __init__(self, std: float = 0.0, script=None):
        self.std = float(std)
        self._script = script if script is not None else PushBlockScript()
        self.chunk_shape = (1, int(self._script.action_dim))
        self._chunk: np.ndarray | None = None

    @staticmethod
    def parse(name: str) -> float:
        """``expert`` -> 0.0, ``expert:0.1`` -> 0.1; a ConfigError naming ``policy`` otherwise."""
        return expert_std(name)

    def reset(self) -> None:
        """Episode start: the clean expert keeps no state between episodes; a chunk not yet taken is dropped."""
        self._script.reset()
        self._chunk = None

    def start(self, obs, noise: np.ndarray) -> None:
        """The expert's action for ``obs`` (plus ``std`` x ``noise``), ready when this returns."""
        noise = np.asarray(noise, np.float32)
        if noise.shape != self.chunk_shape:
            raise ValueError(f"noise: expected {self.chunk_shape}, got {noise.shape}")
        action = self._script.act(obs)
        if self.std:
            action = np.clip(action + np.float32(self.std) * noise[0], -1.0, 1.0).astype(np.float32)
        self._chunk = action[None].copy()

    def result(self) -> np.ndarray:
        """The chunk :meth:`start` computed, float32 ``[1, A]``."""
        if self._chunk is None:
            raise RuntimeError("result() called without a successful start()")
        out, self._chunk = self._chunk, None
        return out

    def state_fingerprint(self) -> dict:
        """The expert and its noise (numpy only: no weights); a MetaWorld expert also names its class and metaworld's version."""
        return {
            "kind": "rollcap.expert",
            "std": self.std,
            "noise": "injected" if self.std else "not an input",
            "numpy": np.__version__,
            **self._script.fingerprint(),
        }

    def close(self) -> None:
        """Nothing to release."""
