"""What bit-exactness depends on, as plain JSON-able dicts, and byte digests.

Importing it imports no torch (an env worker digests numpy state with
:func:`tensor_digest`); :func:`device_fingerprint` imports it.
"""

from __future__ import annotations

import functools
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


CPU_ENV = {
    "mkl_cbwr": "MKL_CBWR",
    "mkl_instructions": "MKL_ENABLE_INSTRUCTIONS",
    "onednn_isa": "ONEDNN_MAX_CPU_ISA",
    "aten_cpu_capability_env": "ATEN_CPU_CAPABILITY",
}
"""Fingerprint field -> the environment variable that steers a CPU library's kernel choice (each measured or documented
to change bits on one machine: ``MKL_ENABLE_INSTRUCTIONS=AVX2`` changes the shipped policy's first chunk here)."""


@functools.cache
def cpu_identity() -> str:
    """The host CPU as the vendor libraries tell CPUs apart: ``"GenuineIntel 6/207"`` (vendor, family/model).

    MKL picks its GEMM kernels from the CPUID vendor and model (and, outside its CNR mode, cache sizes that follow the
    model), so the same torch, the same ATen capability and the same ``MKL_CBWR`` give other bits on an Intel and an
    AMD box. Read from ``/proc/cpuinfo`` on Linux (x86: vendor, family, model; Arm: implementer, part); elsewhere
    ``platform.processor()``.
    """
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block names the machine's model
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "vendor_id" in fields:
        return f"{fields['vendor_id']} {fields.get('cpu family', '?')}/{fields.get('model', '?')}"
    if "CPU implementer" in fields:
        return f"arm {fields['CPU implementer']}/{fields.get('CPU part', '?')}"
    return platform.processor() or platform.machine()


def device_fingerprint(device: torch.device | str, threads: int | None = None) -> dict:
    """Facts about the compute device and kernel set that change float results.

    Every device names the host CPU (:func:`cpu_identity`): the vendor libraries' kernel choice follows it, and the
    env and the host's numpy run there. On CPU it also names the ATen kernel capability (AVX2 vs AVX512 give other
    bits) and the environment variables that steer MKL and oneDNN (:data:`CPU_ENV`); on CUDA the device name, compute
    capability, multiprocessor count (cuBLAS picks kernels by it) and the CUDA and cuDNN versions.
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
        "cpu": cpu_identity(),
    }
    if device.type == "cpu":
        fp["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        fp.update({field: os.environ.get(var, "") for field, var in CPU_ENV.items()})
        if threads is not None:
            fp["threads"] = int(threads)
    elif device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        fp["cuda_device"] = props.name
        fp["cuda_capability"] = f"{props.major}.{props.minor}"
        fp["cuda_sms"] = int(props.multi_processor_count)
        fp["cuda"] = torch.version.cuda
        fp["cudnn"] = str(torch.backends.cudnn.version())
    return fp
