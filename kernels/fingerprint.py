"""What bit-exactness depends on, as plain JSON-able dicts, and byte digests.

Importing it imports no torch (an env worker digests numpy state with
:func:`tensor_digest`); :func:`device_fingerprint` imports it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def is_tensor(value) -> bool:
    """``isinstance(value, torch.Tensor)``, without importing torch: no tensor exists before torch is imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_digest(tensors: dict[str, torch.Tensor] | dict[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        if is_tensor(t):
            import torch

            arr = t.detach().to("cpu").contiguous()
            dtype = str(arr.dtype)
            shape = tuple(arr.shape)
            raw = arr.reshape(-1).view(torch.uint8).numpy().tobytes() if arr.numel() else b""
        else:
            arr = np.ascontiguousarray(t)
            dtype, shape, raw = str(arr.dtype), arr.shape, arr.tobytes()
        h.update(f"{name}|{dtype}|{shape}|".encode())
        h.update(raw)
    return "sha256:" + h.hexdigest()


def device_fingerprint(device: torch.device | str, threads: int | None = None) -> dict:
    """Facts about the compute device and kernel set that change float results.

    On CPU this names the ATen kernel capability (AVX2 vs AVX512 give different
    bits) and ``MKL_CBWR``; on CUDA the device name and compute capability.
    """
    import torch

    device = torch.device(device)
    fp = {
        "device_kind": device.type,
        "torch": str(
            torch.__version__
        ),  # a plain str: TorchVersion parses a Version on every == (restore compares fingerprints)
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    if device.type == "cpu":
        fp["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        fp["mkl_cbwr"] = os.environ.get("MKL_CBWR", "")
        fp["aten_cpu_capability_env"] = os.environ.get("ATEN_CPU_CAPABILITY", "")
        if threads is not None:
            fp["threads"] = int(threads)
    elif device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        fp["cuda_device"] = torch.cuda.get_device_name(idx)
        fp["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(idx)))
        fp["cuda"] = torch.version.cuda
        fp["cudnn"] = str(torch.backends.cudnn.version())
    return fp
