"""Moving capsules between tiers: device -> host -> disk, and back.

- device: tensors beside the live buffers (same device). Fastest restore.
- host: CPU memory; page-locked (``pin_memory``) when the source is CUDA so
  the copy back is a DMA. On a CPU-only deployment host and device are the
  same memory and moving between them copies nothing.
- disk: a directory per capsule (:mod:`rollcap.capsule.disk`: the format, atomic
  writes, sealed manifests, the dtype table).

Importing it imports no torch, and copies of numpy buffers never do; the disk
tier (safetensors, torch) is imported when a capsule goes to or comes from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rollcap.capsule.capsule import Capsule, carried_digest
from rollcap.capsule.errors import CapsuleMismatch
from rollcap.capsule.protocol import StateValue

if TYPE_CHECKING:
    import torch


def _sync(devices: set[torch.device]) -> None:
    if not devices:
        return
    import torch

    for dev in devices:
        if dev.type == "cuda":
            torch.cuda.current_stream(dev).synchronize()


def copy_state(live: Mapping[str, Mapping[str, StateValue]], tier: str) -> dict[str, dict[str, StateValue]]:
    """Independent contiguous copies of live values, placed for ``tier`` (``device`` or ``host``).

    Torch tensors on one device are copied with one ``torch._foreach_copy_``;
    CUDA -> host copies go to pinned memory and are waited for before return.
    """
    out: dict[str, dict[str, StateValue]] = {c: {} for c in live}
    groups: dict[torch.device, tuple[list, list]] = {}
    waits: set[torch.device] = set()
    for comp, values in live.items():
        for name, v in values.items():
            if isinstance(v, np.ndarray):
                out[comp][name] = np.array(v, order="C", copy=True)
                continue
            import torch  # a tensor: torch is imported already

            src = v.detach()
            if tier == "host" and src.device.type == "cuda":
                dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
                dst.copy_(src, non_blocking=True)
                waits.add(src.device)
            else:
                dst = torch.empty(src.shape, dtype=src.dtype, device=src.device)
                dsts, srcs = groups.setdefault(src.device, ([], []))
                dsts.append(dst)
                srcs.append(src)
            out[comp][name] = dst
    for dsts, srcs in groups.values():
        torch._foreach_copy_(dsts, srcs)
    _sync(waits)
    return out


def clone_state(capsule: Capsule) -> dict[str, dict[str, StateValue]]:
    """Independent copies of an in-memory capsule's values, in the same places (pinned stays pinned)."""
    out: dict[str, dict[str, StateValue]] = {}
    for comp, values in capsule.state.items():
        out[comp] = {}
        for name, v in values.items():
            if isinstance(v, np.ndarray):
                out[comp][name] = np.array(v, copy=True)
            else:
                import torch

                pinned = v.device.type == "cpu" and v.is_pinned()
                out[comp][name] = torch.empty(v.shape, dtype=v.dtype, device=v.device, pin_memory=pinned).copy_(v)
    return out


def _moved(capsule: Capsule, tier: str, state: dict) -> Capsule:
    return Capsule(
        capsule.boundary, capsule.specs, capsule.fingerprints, tier, state, known_digest=carried_digest(capsule)
    )


def to_device(capsule: Capsule) -> Capsule:
    """The capsule with its tensors on the devices of the live buffers they came from."""
    if capsule.tier == "device":
        return capsule
    if capsule.tier == "disk":
        capsule = from_disk(capsule)
    capsule.check_untouched()
    state: dict[str, dict[str, StateValue]] = {}
    waits: set[torch.device] = set()
    for comp, values in capsule.state.items():
        state[comp] = {}
        for name, v in values.items():
            if isinstance(v, np.ndarray):  # numpy lives on the CPU, at home
                state[comp][name] = v
                continue
            import torch

            home = torch.device(capsule.specs[comp][name].device)
            if v.device != home:
                if home.type == "cuda" and not torch.cuda.is_available():
                    raise CapsuleMismatch(
                        f"{comp}.{name} was taken on {home}, and this process has no CUDA; restore from the host tier instead",
                        component=comp,
                        field=name,
                        expected=str(home),
                        got="cpu",
                    )
                v = v.to(home, non_blocking=v.is_pinned())
                waits.add(home)
            state[comp][name] = v
    _sync(waits)
    return _moved(capsule, "device", state)


def to_host(capsule: Capsule) -> Capsule:
    """The capsule in CPU memory (pinned where its source is CUDA)."""
    if capsule.tier == "host":
        return capsule
    if capsule.tier == "disk":
        return from_disk(capsule)
    capsule.check_untouched()
    return _moved(capsule, "host", copy_state(capsule.state, "host"))


def from_disk(capsule: Capsule) -> Capsule:
    """A disk-tier capsule read into memory (:func:`rollcap.capsule.disk.load`, its digest checked)."""
    from rollcap.capsule.disk import load

    return load(capsule.path, expect_digest=capsule.known_digest)


def move(capsule: Capsule, tier: str, path: str | Path | None = None) -> Capsule:
    """The capsule on ``tier``; ``path`` is the directory to write for the disk tier."""
    if tier == "device":
        return to_device(capsule)
    if tier == "host":
        return to_host(capsule)
    if tier == "disk":
        if capsule.tier == "disk" and path is None:
            return capsule
        if path is None:
            raise ValueError("moving a capsule to the disk tier needs a path for its directory")
        from rollcap.capsule.disk import save

        return save(capsule, path)
    raise ValueError(f"unknown tier {tier!r}; choose device, host or disk")


# -- disk: writing -----------------------------------------------------------------
