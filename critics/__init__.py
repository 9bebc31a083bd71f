"""The value critic and its runner.

Imports point downward only: ``critics`` uses ``kernels``, ``capsule`` and the
observation encoder of ``policies``; it knows nothing of episodes. Names are
imported on first use (:mod:`rollcap.kernels.lazy`): the shipped checkpoints'
paths come without torch.
"""

from __future__ import annotations

from rollcap.kernels.lazy import lazy_names

_NAMES = {
    "DEFAULT_CHECKPOINT": "shipped",
    "MT10_CHECKPOINT": "shipped",
    "CriticRunner": "runner",
    "ValueCritic": "value_critic",
    "ValueCriticConfig": "value_critic",
    "load_critic": "runner",
    "save_critic": "runner",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
