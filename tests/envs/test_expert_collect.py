"""Scripted expert success and mistakes; demo collection; the bench function."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollcap.envs import PushBlockConfig, PushBlockEnv
from rollcap.envs.bench import bench_env
from rollcap.envs.collect import collect_demos, episode_seeds
from rollcap.envs.expert import ExpertNoise, ScriptedExpert


def _success_rate(noise: ExpertNoise | None, episodes: int) -> float:
    env = PushBlockEnv(render_images=False)
    expert = ScriptedExpert(noise)
    wins = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=ep)
        expert.reset(10_000 + ep)
        while True:
            obs, _, terminated, truncated, info = env.step(expert.act(obs))
            if terminated or truncated:
                break
        wins += info["is_success"]
    return wins / episodes


def test_clean_expert_succeeds():
    """With no noise the expert solves >= 95% of seeded episodes."""
    assert _success_rate(None, 100) >= 0.95


def test_action_noise_alone_is_tolerated():
    """Moderate action noise still mostly succeeds (noisy but useful demos)."""
    assert _success_rate(ExpertNoise(action_std=0.3), 30) >= 0.8


@pytest.mark.parametrize(
    "noise", [ExpertNoise(wrong_block_prob=1.0), ExpertNoise(give_up_prob=1.0, give_up_after=(0, 3))]
)
def test_mistakes_make_failures(noise):
    """Wrong-block and give-up mistakes produce failed episodes."""
    assert _success_rate(noise, 10) <= 0.2


def test_noise_validation():
    """Out-of-range knobs name themselves."""
    with pytest.raises(ValueError, match="wrong_block_prob"):
        ExpertNoise(wrong_block_prob=1.5)
    with pytest.raises(ValueError, match="action_std"):
        ExpertNoise(action_std=-0.1)


def test_collect_demos_shapes_and_determinism():
    """Episodes hold T+1 observations, T actions/rewards; the same seed gives identical bytes."""
    noise = ExpertNoise(action_std=0.2, wrong_block_prob=0.3)
    eps = collect_demos(4, seed=7, expert_noise=noise)
    again = collect_demos(4, seed=7, expert_noise=noise)
    for e, f in zip(eps, again):
        t = len(e)
        assert e.observations["image_front"].shape == (t + 1, 64, 64, 3)
        assert e.observations["state"].shape == (t + 1, 28)
        assert e.actions.shape == (t, 2) and e.actions.dtype == np.float32
        assert e.rewards.shape == (t,) and e.instruction.startswith("push the ")
        assert e.observations["image_front"].tobytes() == f.observations["image_front"].tobytes()
        assert e.actions.tobytes() == f.actions.tobytes() and e.rewards.tobytes() == f.rewards.tobytes()
    other = collect_demos(4, seed=8, expert_noise=noise)
    assert [e.seed for e in other] != [e.seed for e in eps]


def test_episode_seeds_do_not_depend_on_count():
    """Episode i depends only on (seed, i): collecting fewer gives a prefix."""
    assert episode_seeds(3, 5)[:2] == episode_seeds(3, 2)
    small = collect_demos(2, seed=3, env_config=PushBlockConfig(render_images=False))
    assert [e.actions.tobytes() for e in small] == [
        e.actions.tobytes() for e in collect_demos(3, seed=3, env_config=PushBlockConfig(render_images=False))[:2]
    ]


def test_initial_state_replays_the_episode():
    """Restoring an episode's initial_state and replaying its actions reproduces its rewards."""
    ep = collect_demos(1, seed=5, env_config=PushBlockConfig(render_images=False))[0]
    env = PushBlockEnv(render_images=False)
    env.set_state(ep.initial_state)
    rewards = [env.step(a)[1] for a in ep.actions]
    assert np.asarray(rewards, np.float64).tobytes() == ep.rewards.tobytes()


def test_bench_env_is_json_able():
    """bench_env returns positive rates in a JSON-able dict."""
    result = bench_env(steps=100)
    json.dumps(result)
    assert result["steps_per_s_no_images"] > 0 and result["steps_per_s_images"] > 0
    assert result["render_ms_per_frame"] > 0
