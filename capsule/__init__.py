"""Capsules: snapshot / restore / fork / rollback of named execution state.

A capsule is the closed set of named buffers a boundary depends on, with
boundary metadata, each component's deployment fingerprint and a digest of
the bytes. It lives on a tier (device, host, disk) and moves between them.
The verbs are copies of buffers: restoring never captures or rebuilds a graph.

Mechanism only, except for :class:`CapsuleRegistry`, whose policy (budgets,
LRU demotion, pinning, promotion on use) is explicit in :class:`TierBudgets`
and :class:`RegistryPolicy`. Nothing here knows what an episode is.

Imports point downward only: ``capsule`` imports ``rollcap.kernels`` and
nothing else of rollcap; ``policies``, ``critics``, ``envs`` and ``rollout``
import ``capsule``.
"""

from __future__ import annotations

from rollcap.capsule.bench import bench_capsules
from rollcap.capsule.capsule import TIERS, Boundary, BufferInfo, Capsule, buffer_digest, combine_digests
from rollcap.capsule.cli import add_subparser, format_manifest, inspect_main
from rollcap.capsule.errors import CapsuleError, CapsuleMismatch, CorruptCapsule, RegistryFull, UnknownBoundary
from rollcap.capsule.protocol import StateValue, Stateful
from rollcap.capsule.registry import CapsuleRegistry, RegistryPolicy, RegistryStats, TierBudgets
from rollcap.capsule.session import Session, rollback
from rollcap.capsule.disk import FORMAT_VERSION, Manifest, load, open_disk, read_manifest, save, verify
from rollcap.capsule.tiers import move, to_device, to_host
from rollcap.capsule.verbs import fork, restore, snapshot, validate

__all__ = [
    "FORMAT_VERSION",
    "TIERS",
    "Boundary",
    "BufferInfo",
    "Capsule",
    "CapsuleError",
    "CapsuleMismatch",
    "CapsuleRegistry",
    "CorruptCapsule",
    "Manifest",
    "RegistryFull",
    "RegistryPolicy",
    "RegistryStats",
    "Session",
    "StateValue",
    "Stateful",
    "TierBudgets",
    "UnknownBoundary",
    "add_subparser",
    "bench_capsules",
    "buffer_digest",
    "combine_digests",
    "format_manifest",
    "fork",
    "inspect_main",
    "load",
    "move",
    "open_disk",
    "read_manifest",
    "restore",
    "rollback",
    "save",
    "snapshot",
    "to_device",
    "to_host",
    "validate",
    "verify",
]
