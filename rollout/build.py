"""Build the parts a run needs from names and paths (the CLI's and replay's wiring)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

from rollcap.critics import DEFAULT_CHECKPOINT as DEFAULT_CRITIC
from rollcap.critics import CriticRunner, load_critic
from rollcap.kernels.lanes import make_lane
from rollcap.policies import DEFAULT_CHECKPOINT as DEFAULT_POLICY
from rollcap.policies import PolicyRunner, load_policy

DEFAULT_ENV = "rollcap/PushBlock-v0"


@dataclass(frozen=True)
class Parts:
    """Where models and the env come from."""

    env_id: str = DEFAULT_ENV
    """A registered gymnasium id (``import rollcap.envs`` registers the built-ins)."""
    env_kwargs: dict | None = None
    """Keyword arguments for ``gym.make``."""
    policy: Path = DEFAULT_POLICY
    """Policy checkpoint (``.json`` or ``.safetensors`` path)."""
    critic: Path = DEFAULT_CRITIC
    """Critic checkpoint."""
    device: str = "cpu"
    """``cpu`` or ``cuda[:i]``."""
    backend: str | None = None
    """``eager``/``jit``/``cuda``; None picks the device's captured backend."""
    threads: int = 1
    """Intra-op threads per CPU lane (policy and critic each get one lane)."""


def make_env(env_id: str = DEFAULT_ENV, env_kwargs: dict | None = None):
    """``gym.make`` with rollcap's envs registered and a clear error for unknown ids."""
    import rollcap.envs  # noqa: F401  (registers rollcap/*)

    try:
        return gym.make(env_id, **(env_kwargs or {}))
    except gym.error.Error as err:
        raise ValueError(f"--env {env_id!r}: {err}") from err
    except TypeError as err:
        raise ValueError(f"--env-kwargs for {env_id}: {err}") from err


def make_runners(parts: Parts) -> tuple[PolicyRunner, CriticRunner]:
    """Load both checkpoints and capture their graphs, each on its own lane."""
    policy = load_policy(parts.policy)
    critic = load_critic(parts.critic)
    return (
        PolicyRunner(policy, parts.device, parts.backend, make_lane("policy", parts.device, parts.threads)),
        CriticRunner(critic, parts.device, parts.backend, make_lane("critic", parts.device, parts.threads)),
    )
