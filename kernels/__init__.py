"""Execution substrate: named static buffers, captured graphs, lanes, fused ops.

Mechanism only. This package imports nothing else of rollcap and knows nothing
of episodes, sessions or caching; everything above it calls downward into it.
"""

from __future__ import annotations

from rollcap.kernels.buffers import BufferSet, BufferSpec
from rollcap.kernels.errors import BadInput, CaptureError, CaptureHazard, CheckpointMismatch, LaneError, ReplayInFlight
from rollcap.kernels.fingerprint import device_fingerprint, tensor_digest
from rollcap.kernels.graph import BACKENDS, CapturedGraph, capture_count, default_backend
from rollcap.kernels.lanes import CallerLane, CpuLane, CudaLane, Lane, make_lane
from rollcap.kernels.ops import cfg_euler_step, cfg_euler_step_reference

__all__ = [
    "BACKENDS",
    "BadInput",
    "BufferSet",
    "BufferSpec",
    "CaptureError",
    "CaptureHazard",
    "CheckpointMismatch",
    "CallerLane",
    "CapturedGraph",
    "CpuLane",
    "CudaLane",
    "Lane",
    "LaneError",
    "ReplayInFlight",
    "capture_count",
    "cfg_euler_step",
    "cfg_euler_step_reference",
    "default_backend",
    "device_fingerprint",
    "make_lane",
    "tensor_digest",
]
