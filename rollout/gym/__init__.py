"""Gymnasium envs over the episode core, for RL loops.

:class:`~.envs.ChunkEnv` (an action is a chunk) and
:class:`~.envs.NoiseSteeringEnv` (an action is the flow noise that steers a
frozen policy), registered as ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` when ``rollcap`` is imported; their
vector envs over the batched core (:mod:`~.vector`), and SB3's ``VecEnv`` over
those (:mod:`~.sb3`, with the ``rl`` extra).
"""

from rollcap.rollout.gym.core import instruction_tokens
from rollcap.rollout.gym.envs import ChunkEnv, NoiseSteeringEnv, make_chunk_env, make_noise_steering_env

__all__ = ["ChunkEnv", "NoiseSteeringEnv", "instruction_tokens", "make_chunk_env", "make_noise_steering_env"]
