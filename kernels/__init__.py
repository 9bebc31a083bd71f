"""Execution substrate: named static buffers, captured graphs, lanes, fused ops.

Mechanism only. This package imports nothing else of rollcap and knows nothing
of episodes, sessions or caching; everything above it calls downward into it.
Its names are imported on first use (:mod:`rollcap.kernels.lazy`): importing
the package, or its torch-free modules (``files``, ``errors``, ``fingerprint``'s
digests), imports no torch.
"""

from __future__ import annotations

from rollcap.kernels.lazy import lazy_names

_NAMES = {
    "BACKENDS": "graph",
    "BadInput": "errors",
    "BufferSet": "buffers",
    "BufferSpec": "buffers",
    "CaptureError": "errors",
    "CaptureHazard": "errors",
    "CheckpointMismatch": "errors",
    "CallerLane": "lanes",
    "CapturedGraph": "graph",
    "CpuLane": "lanes",
    "CudaLane": "lanes",
    "Lane": "lanes",
    "LaneError": "errors",
    "ReplayInFlight": "errors",
    "capture_count": "graph",
    "cfg_euler_step": "ops",
    "cfg_euler_step_reference": "ops",
    "default_backend": "graph",
    "device_fingerprint": "fingerprint",
    "make_lane": "lanes",
    "tensor_digest": "fingerprint",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
