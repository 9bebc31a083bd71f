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
import ``capsule``. Names are imported on first use
(:mod:`rollcap.kernels.lazy`): importing the package, or the verbs on numpy
state (an env's exact state, the host's counters), imports no torch.
"""

from __future__ import annotations

from rollcap.kernels.lazy import lazy_names

_NAMES = {
    "bench_capsules": "bench",
    "TIERS": "capsule",
    "Boundary": "capsule",
    "BufferInfo": "capsule",
    "Capsule": "capsule",
    "buffer_digest": "capsule",
    "combine_digests": "capsule",
    "add_subparser": "cli",
    "format_manifest": "cli",
    "inspect_main": "cli",
    "CapsuleError": "errors",
    "CapsuleMismatch": "errors",
    "CorruptCapsule": "errors",
    "RegistryFull": "errors",
    "UnknownBoundary": "errors",
    "StateValue": "protocol",
    "Stateful": "protocol",
    "CapsuleRegistry": "registry",
    "RegistryPolicy": "registry",
    "RegistryStats": "registry",
    "TierBudgets": "registry",
    "Session": "session",
    "rollback": "session",
    "FORMAT_VERSION": "disk",
    "Manifest": "disk",
    "load": "disk",
    "open_disk": "disk",
    "read_manifest": "disk",
    "save": "disk",
    "verify": "disk",
    "move": "tiers",
    "to_device": "tiers",
    "to_host": "tiers",
    "fork": "verbs",
    "restore": "verbs",
    "snapshot": "verbs",
    "validate": "verbs",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
