"""The VLA flow policy and its runner.

Imports point downward only: ``policies`` uses ``kernels`` (and ``capsule``);
it knows nothing of episodes, envs or recordings. Names are imported on first
use (:mod:`rollcap.kernels.lazy`): the observation spec, the tokenizer and the
shipped checkpoints' paths come without torch.
"""

from __future__ import annotations

from rollcap.kernels.lazy import lazy_names

_NAMES = {
    "ADV_DROPPED": "flow_vla",
    "ADV_NEGATIVE": "flow_vla",
    "ADV_POSITIVE": "flow_vla",
    "DEFAULT_CHECKPOINT": "shipped",
    "MT10_CHECKPOINT": "shipped",
    "FlowSDERunner": "flow_sde",
    "FlowVLA": "flow_vla",
    "FlowVLAConfig": "flow_vla",
    "ObsSpec": "observation",
    "PolicyRunner": "runner",
    "load_policy": "runner",
    "save_policy": "runner",
    "tokenize": "observation",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
