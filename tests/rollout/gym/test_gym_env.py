"""Gymnasium envs over the episode core: checkers, determinism across instances and processes, recording."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rollcap  # noqa: F401  (registers the ids)
from rollcap.rollout.config import HostConfig
from rollcap.rollout.gym.core import instruction_tokens
from rollcap.rollout.gym.envs import ChunkEnv, NoiseSteeringEnv
from rollcap.rollout.recording import EpisodeRecorder
from rollcap.rollout.offline.replay import replay_closed, replay_env, replay_policy
from tests.rollout._tiny import make_env, make_runners

CFG = HostConfig(seed=0, max_chunks=6)


def tiny_chunk_env(**kw):
    p, c = make_runners(seed=2)
    return ChunkEnv(make_env(), p, c, CFG, **kw)


def tiny_noise_env(**kw):
    p, c = make_runners(seed=2)
    return NoiseSteeringEnv(make_env(), p, c, CFG, **kw)


def _rollout(env, seed: int, actions_seed: int = 0, n: int = 10):
    """Observations, rewards and flags of up to n steps from reset(seed) with seeded actions."""
    rng = np.random.default_rng(actions_seed)
    obs, _ = env.reset(seed=seed)
    out = [tuple(v.tobytes() for v in obs.values())]
    for _ in range(n):
        a = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        obs, r, term, trunc, info = env.step(a)
        out.append((tuple(v.tobytes() for v in obs.values()), r, term, trunc, info.get("stop_reason")))
        if term or trunc:
            obs, _ = env.reset()
            out.append(tuple(v.tobytes() for v in obs.values()))
    return out


@pytest.mark.parametrize("make", [tiny_chunk_env, tiny_noise_env, lambda: tiny_noise_env(value_in_obs=True)])
def test_gymnasium_env_checker_passes(make):
    """gymnasium's check_env (spaces, seeding, determinism of reset) passes; its only notes are the chunk env's
    unbounded ``policy_chunk`` (the policy's raw chunk, as gymnasium's own MuJoCo observations are unbounded)."""
    env = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    env.close()
    notes = {str(w.message) for w in caught}
    assert all("infinity" in m for m in notes) and bool(notes) == isinstance(env, ChunkEnv), notes


@pytest.mark.parametrize("make", [tiny_chunk_env, tiny_noise_env])
def test_sb3_env_checker_passes(make):
    """Stable-Baselines3's check_env passes (skipped without the rl extra), with only the advice named here.

    Its warnings are advice about SB3's defaults, not faults of the env, and
    are asserted rather than shown: the tiny env's 32x32 images are below the
    36x36 that SB3's default ``CnnPolicy`` needs (the shipped env is 64x64), the
    noise env's action space (the policy's flow noise, a standard normal) is
    deliberately not the [-1, 1] box SB3 recommends, and the chunk env's
    ``policy_chunk`` is ``(H, A)``, the action's shape, not a 1-D vector (SB3's
    ``MultiInputPolicy`` flattens it).
    """
    sb3_checker = pytest.importorskip("stable_baselines3.common.env_checker")
    env = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_checker.check_env(env, warn=True, skip_render_check=True)
    env.close()
    expected = ("minimal resolution for an image is 36x36",) + (
        ("symmetric and normalized Box action space",)
        if make is tiny_noise_env
        else ("Your observation policy_chunk has an unconventional shape",)
    )
    messages = [str(w.message) for w in caught]
    assert all(any(e in m for e in expected) for m in messages), messages
    assert all(any(e in m for m in messages) for e in expected), messages


@pytest.mark.slow
@pytest.mark.parametrize("make", [tiny_chunk_env, tiny_noise_env])
def test_same_seed_same_actions_same_episode_in_two_instances(make):
    """reset(seed) and the same actions give byte-identical observations, rewards and flags in a second instance."""
    a, b = make(), make()
    assert _rollout(a, 11) == _rollout(b, 11)
    assert _rollout(a, 11) != _rollout(a, 12)
    a.close()
    b.close()


@pytest.mark.slow
def test_async_vector_env_matches_a_single_env_across_processes():
    """Inside AsyncVectorEnv (2 worker processes) each sub-env is exactly the same as a single env with its seed."""
    venv = gym.vector.AsyncVectorEnv([lambda: tiny_noise_env(), lambda: tiny_noise_env()], context="spawn")
    obs, _ = venv.reset(seed=[5, 6])
    rng = np.random.default_rng(0)
    actions = [rng.standard_normal((2, 4, 2)).astype(np.float32) for _ in range(3)]
    rewards = []
    for a in actions:
        obs_v, r, term, trunc, _ = venv.step(a)
        rewards.append(r.copy())
    venv.close()
    for k, seed in enumerate((5, 6)):
        single = tiny_noise_env()
        single.reset(seed=seed)
        for t, a in enumerate(actions):
            o, r, term, trunc, _ = single.step(a[k])
            assert r == rewards[t][k]
        assert all(np.array_equal(o[key], obs_v[key][k]) for key in o)
        single.close()


@pytest.mark.slow
def test_steered_episodes_are_recorded_and_replay_exactly(tmp_path):
    """The noise an agent chose is recorded; the episode replays exactly in every mode."""
    p, c = make_runners(seed=2)
    rec = EpisodeRecorder(tmp_path / "r")
    env = NoiseSteeringEnv(make_env(), p, c, CFG, subscribers=(rec,))
    env.reset(seed=3)
    noise = np.full((4, 2), 0.5, np.float32)
    done = False
    while not done:
        *_, term, trunc, _ = env.step(noise)
        done = term or trunc
    env.reset()  # finishes nothing (already finished); starts episode 1
    env.close()
    records = rollcap.load(tmp_path / "r")
    assert len(records) == 1
    r = records[0]
    assert (r.chunks["noise"] == 0.5).all()
    q, c2 = make_runners(seed=2)
    from rollcap.rollout.host import RolloutHost

    assert replay_policy(r, q, c2).exact and replay_env(r, make_env()).exact
    # closed loop from the seed would use derived noise, not the agent's: it must say so, never "exact"
    closed = replay_closed(r, RolloutHost(make_env(), q, c2, HostConfig.from_json(r.config)))
    assert closed.status == "not comparable" and "actions came from the caller" in closed.line()


def test_chunk_env_executes_the_agents_chunk_and_ends_as_gymnasium_says():
    """The env receives the agent's chunk; a chunk limit truncates (not terminates); info names the stop."""
    env = tiny_chunk_env()
    env.reset(seed=1)
    chunk = np.full((4, 2), 0.3, np.float32)
    steps = 0
    while True:
        obs, r, term, trunc, info = env.step(chunk)
        steps += info["steps"]
        if term or trunc:
            break
    assert info["stop_reason"] == "timeout_chunks" and trunc and not term
    assert steps == 6 * 4
    assert obs["instruction_tokens"].dtype == np.int64
    with pytest.raises(gym.error.ResetNeeded):
        env.step(chunk)
    env.close()


def test_instruction_tokens_round_trip():
    """Instruction bytes framed by BOS/EOS and padded; too long is refused."""
    t = instruction_tokens("push", 8)
    assert t.tolist() == [257, *b"push", 258, 256, 256]
    with pytest.raises(ValueError, match="does not fit"):
        instruction_tokens("x" * 10, 8)


@pytest.mark.slow
def test_registered_ids_build_the_shipped_task():
    """gym.make of the registered ids gives the built-in task with the shipped policy, Dict observations."""
    env = gym.make("rollcap/NoiseSteerPushBlock-v0", value_in_obs=True)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"image_front", "state", "instruction_tokens", "value"}
    assert env.action_space.shape == (8, 2)
    env.close()


def test_an_exception_inside_a_step_reaches_the_caller_and_reset_recovers():
    """A policy that raises at a boundary: step() raises that error; reset() starts a clean episode."""
    env = tiny_noise_env()
    env.reset(seed=0)
    real = env.host.policy.start

    def broken(obs, noise):
        raise RuntimeError("policy server went away")

    env.host.policy.start = broken
    with pytest.raises(RuntimeError, match="policy server went away"):
        env.step(np.zeros((4, 2), np.float32))
    env.host.policy.start = real
    env.reset(seed=0)
    assert env.step(np.zeros((4, 2), np.float32))[4]["steps"] == 4
    env.close()
