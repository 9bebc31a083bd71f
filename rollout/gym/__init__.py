"""Gymnasium envs over the episode core, for RL loops.

:class:`~.envs.ChunkEnv` (an action is a chunk) and
:class:`~.envs.NoiseSteeringEnv` (an action is the flow noise that steers a
frozen policy), registered as ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` when ``rollcap`` is imported.
"""

from rollcap.rollout.gym.envs import (
    ChunkEnv,
    NoiseSteeringEnv,
    instruction_tokens,
    make_chunk_env,
    make_noise_steering_env,
)

__all__ = ["ChunkEnv", "NoiseSteeringEnv", "instruction_tokens", "make_chunk_env", "make_noise_steering_env"]
