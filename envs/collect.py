"""Collect scripted-expert demonstrations on ``rollcap/PushBlock-v0``."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.envs.push_block import PushBlockConfig, PushBlockEnv


@dataclass
class Episode:
    """One demonstration. ``actions[t]`` was taken at ``observations[k][t]``."""

    seed: int
    """The env's ``reset(seed=...)`` for this episode."""
    instruction: str
    """The episode's instruction (constant over the episode)."""
    task: tuple[int, int]
    """(block, target) indices into ``BLOCKS`` / ``TARGETS``."""
    observations: dict[str, np.ndarray]
    """Array observation keys (``state``, ``image_front``...), ``T + 1`` rows: the
    reset observation, then the one after each step."""
    actions: np.ndarray
    """float32 ``(T, 2)``, as executed (already inside [-1, 1])."""
    rewards: np.ndarray
    """float64 ``(T,)``."""
    success: bool
    """Whether the episode ended on success (``info["is_success"]``)."""
    truncated: bool
    """Whether the episode hit the time limit."""
    mistake: str | None = None
    """The expert's planned mistake for this episode (``"wrong_block"``, ``"give_up"``) or None."""
    initial_state: dict[str, np.ndarray] = field(default_factory=dict)
    """``env.get_state()`` right after reset, for exact replay."""

    def __len__(self) -> int:
        return len(self.actions)


def episode_seeds(seed: int, n_episodes: int) -> list[tuple[int, int]]:
    """Derive (env seed, expert seed) for each episode from one seed.

    Episode ``i`` depends only on ``(seed, i)``, so any split of the work
    across processes gives the same episodes.
    """
    children = np.random.SeedSequence(seed).spawn(n_episodes)
    out = []
    for child in children:
        words = child.generate_state(2, dtype=np.uint64) >> np.uint64(1)
        out.append((int(words[0]), int(words[1])))
    return out


def collect_demos(
    n_episodes: int,
    seed: int,
    expert_noise: ExpertNoise | None = None,
    env_config: PushBlockConfig | None = None,
) -> list[Episode]:
    """Roll out the scripted expert; deterministic given the arguments.

    Args:
        n_episodes: how many episodes.
        seed: base seed; episode seeds are derived with :func:`episode_seeds`.
        expert_noise: the expert's noise knobs (default: the clean expert).
        env_config: env options (default: 64x64 images, numpy renderer).
    """
    if n_episodes < 0:
        raise ValueError(f"n_episodes must be >= 0, got {n_episodes}")
    env = PushBlockEnv(config=env_config)
    expert = ScriptedExpert.for_env(env.config, expert_noise)
    episodes = []
    try:
        for env_seed, expert_seed in episode_seeds(seed, n_episodes):
            episodes.append(_one_episode(env, expert, env_seed, expert_seed))
    finally:
        env.close()
    return episodes


def _one_episode(env: PushBlockEnv, expert: ScriptedExpert, env_seed: int, expert_seed: int) -> Episode:
    obs, _ = env.reset(seed=env_seed)
    expert.reset(expert_seed)
    initial_state = env.get_state()
    keys = [k for k, v in obs.items() if isinstance(v, np.ndarray)]
    frames = {k: [obs[k]] for k in keys}
    actions, rewards = [], []
    while True:
        action = expert.act(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        for k in keys:
            frames[k].append(obs[k])
        if terminated or truncated:
            break
    return Episode(
        seed=env_seed,
        instruction=env.instruction,
        task=env.task,
        observations={k: np.stack(v) for k, v in frames.items()},
        actions=np.stack(actions).astype(np.float32),
        rewards=np.asarray(rewards, dtype=np.float64),
        success=bool(info["is_success"]),
        truncated=bool(truncated),
        mistake=expert.mistake,
        initial_state=initial_state,
    )
