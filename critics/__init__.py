"""The value critic and its runner.

Imports point downward only: ``critics`` uses ``kernels``, ``capsule`` and the
observation encoder of ``policies``; it knows nothing of episodes.
"""

from __future__ import annotations

from rollcap.critics.runner import DEFAULT_CHECKPOINT, MT10_CHECKPOINT, CriticRunner, load_critic, save_critic
from rollcap.critics.value_critic import ValueCritic, ValueCriticConfig

__all__ = [
    "DEFAULT_CHECKPOINT",
    "MT10_CHECKPOINT",
    "CriticRunner",
    "ValueCritic",
    "ValueCriticConfig",
    "load_critic",
    "save_critic",
]
