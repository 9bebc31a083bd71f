"""The rollout host: the episode core, stop predicates, events, recording, replay, the API and the CLI.

``rollout`` sits at the top: it may import every other rollcap package, and
nothing imports it. Decisions (when to stop, what to record, when to snapshot,
which capsule to restore) live here; the packages below provide mechanism.
Within it, calls point downward too: ``protocols`` and ``episode`` <- the host
(``host``, ``predicates``, ``events``, ``subscribers``) <- ``recording`` and
``replay`` <- ``api`` <- ``cli``.

Names are imported lazily (so ``rollcap --help`` and Ctrl-C during start-up
stay fast and quiet); submodules are imported by their users.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "EpisodeRecord": "episode",
    "EventBus": "events",
    "HostConfig": "config",
    "HostState": "lifecycle",
    "RolloutHost": "host",
    "BoundaryView": "predicates",
    "CriticBelow": "predicates",
    "MaxChunks": "predicates",
    "MaxSeconds": "predicates",
    "NonFiniteAction": "predicates",
    "StopPredicate": "predicates",
    "ChunkCritic": "protocols",
    "ChunkEvent": "protocols",
    "ChunkPolicy": "protocols",
    "EpisodeEnd": "protocols",
    "EpisodeStart": "protocols",
    "StepEvent": "protocols",
    "Subscriber": "protocols",
    "InBackground": "subscribers",
    "Metrics": "subscribers",
    "Progress": "subscribers",
    "run": "api",
    "RunResult": "api",
    "Interrupted": "api",
    "make_env": "build",
    "load_any": "recording.runs",
    "export": "recording.exporters",
    "branch_episode": "api",
    "recap": "learn.recap.pipeline",
    "RecapConfig": "learn.recap.config",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'rollcap.rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rollcap.rollout.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
