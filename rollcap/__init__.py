"""rollcap: rollouts for robot policies.

The few names a user needs, in one place::

    import rollcap
    result = rollcap.run(episodes=5, out="runs/api")   # what `rollcap run` does
    result, summary = rollcap.branch("runs/api", episode=0, chunk=3, n=8)   # `rollcap branch`
    manifest = rollcap.recap(["runs/api"], "runs/recap1")   # `rollcap recap`: learn from the run
    print(result.summary["success_rate"])

The parts live in subpackages (``rollcap.rollout``, ``rollcap.envs``,
``rollcap.policies``, ...). These names come from ``rollcap.rollout`` on first
use, so ``import rollcap.envs`` alone does not import torch. Importing
registers the gymnasium ids ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` (see :mod:`rollcap.rollout.gym_env`).
"""

from __future__ import annotations

__all__ = [
    "ChunkCritic",
    "ChunkPolicy",
    "EpisodeEnd",
    "EpisodeRecord",
    "EventBus",
    "HostConfig",
    "Interrupted",
    "RecapConfig",
    "RolloutHost",
    "RunResult",
    "Subscriber",
    "branch",
    "load",
    "make_env",
    "recap",
    "run",
]


GYM_IDS = {
    "rollcap/ChunkPushBlock-v0": "rollcap.rollout.gym_env:make_chunk_env",
    "rollcap/NoiseSteerPushBlock-v0": "rollcap.rollout.gym_env:make_noise_steering_env",
}
"""Gymnasium ids for RL loops (:mod:`rollcap.rollout.gym_env`), registered on import; ``rollcap.envs`` registers the tasks."""


def _register_gym_ids() -> None:
    import gymnasium as gym

    for env_id, entry in GYM_IDS.items():
        if env_id not in gym.registry:  # the envs check their own arguments; gymnasium's passive checker is off
            gym.register(env_id, entry_point=entry, disable_env_checker=True, order_enforce=False)


_register_gym_ids()


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'rollcap' has no attribute {name!r}")
    import rollcap.rollout

    value = getattr(rollcap.rollout, {"load": "load_any", "branch": "branch_episode"}.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
