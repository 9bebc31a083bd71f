"""The VLA flow policy and its runner.

Imports point downward only: ``policies`` uses ``kernels`` (and ``capsule``);
it knows nothing of episodes, envs or recordings.
"""

from __future__ import annotations

from rollcap.policies.flow_sde import FlowSDERunner
from rollcap.policies.flow_vla import ADV_DROPPED, ADV_NEGATIVE, ADV_POSITIVE, FlowVLA, FlowVLAConfig
from rollcap.policies.observation import ObsSpec, tokenize
from rollcap.policies.runner import DEFAULT_CHECKPOINT, MT10_CHECKPOINT, PolicyRunner, load_policy, save_policy

__all__ = [
    "ADV_DROPPED",
    "ADV_NEGATIVE",
    "ADV_POSITIVE",
    "DEFAULT_CHECKPOINT",
    "MT10_CHECKPOINT",
    "FlowSDERunner",
    "FlowVLA",
    "FlowVLAConfig",
    "ObsSpec",
    "PolicyRunner",
    "load_policy",
    "save_policy",
    "tokenize",
]
