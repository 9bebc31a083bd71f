"""The vector envs over the batched core: gymnasium's autoreset rules, spaces, determinism, one graph for all sub-envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rollcap.critics import CriticRunner, ValueCritic
from rollcap.kernels.graph import capture_count
from rollcap.policies import FlowVLA, PolicyRunner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.envs import ChunkEnv
from rollcap.rollout.gym.vector import ChunkVectorEnv, NoiseSteeringVectorEnv
from tests.rollout._tiny import CRITIC, POLICY, make_env

N = 3
CONFIG = HostConfig(max_chunks=3)  # episodes of at most 3 chunks: autoresets within a few steps


def _runners(batch: int):
    torch.manual_seed(0)
    p, c = FlowVLA(POLICY).eval(), ValueCritic(CRITIC).eval()
    return PolicyRunner(p, batch=batch), CriticRunner(c, batch=batch)


def _vector(cls=ChunkVectorEnv, mode=AutoresetMode.NEXT_STEP, **kw):
    return cls([make_env() for _ in range(N)], *_runners(N), CONFIG, autoreset_mode=mode, **kw)


def _actions(env, steps: int, seed: int = 0) -> list[np.ndarray]:
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(steps)]


def _same(a, b) -> bool:
    """Observations equal bit for bit, but the policy's chunk: batch-N rows against batch 1 (~2.5e-7 apart on CPU)."""
    if isinstance(a, dict):
        plan = np.allclose(a["policy_chunk"], b["policy_chunk"], atol=1e-5)
        return plan and data_equivalence(
            *({k: v for k, v in d.items() if k != "policy_chunk"} for d in (a, b)), exact=True
        )
    return data_equivalence(a, b, exact=True)


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_chunk_vector_env_matches_sync_vector_env_of_chunk_envs(mode):
    """Observations, rewards, terminations, truncations and autoresets are SyncVectorEnv's over N ChunkEnvs, bit for bit
    (the policy's chunk in the observation: to batch-N rounding)."""
    ours = _vector(mode=mode)
    theirs = SyncVectorEnv([lambda: ChunkEnv(make_env(), *_runners(1), CONFIG) for _ in range(N)], autoreset_mode=mode)
    try:
        assert ours.metadata["autoreset_mode"] is mode
        assert ours.single_observation_space == theirs.single_observation_space
        assert ours.single_action_space == theirs.single_action_space
        o1, _ = ours.reset(seed=5)
        o2, _ = theirs.reset(seed=5)
        assert _same(o1, o2)
        ended = 0
        for a in _actions(ours, 10):
            r1, r2 = ours.step(a), theirs.step(a)
            for x, y in zip(r1[:4], r2[:4]):
                assert _same(x, y)
            assert ours.observation_space.contains(r1[0])
            ended += int((r1[2] | r1[3]).sum())
            assert (
                list(r1[4]["stop_reason"][r1[4]["_stop_reason"]]) == list(r2[4]["stop_reason"][r2[4]["_stop_reason"]])
                if "stop_reason" in r1[4]
                else "stop_reason" not in r2[4]
            )
            if mode is AutoresetMode.SAME_STEP and (r1[2] | r1[3]).any():
                assert all(_same(x, y) for x, y in zip(r1[4]["final_obs"], r2[4]["final_obs"]) if x is not None)
                assert list(r1[4]["_final_obs"]) == list(r2[4]["_final_obs"])
        assert ended >= N  # every sub-env went through an autoreset at least once
    finally:
        ours.close()
        theirs.close()


def test_noise_steering_vector_env_is_deterministic_and_captures_once():
    """Equal seeds and noise give equal batches; fresh arrays every step; N sub-envs, one capture per graph."""
    before = capture_count()
    a, b = _vector(NoiseSteeringVectorEnv), _vector(NoiseSteeringVectorEnv)
    assert capture_count() - before == 4  # two envs x (policy + critic), whatever N
    try:
        noise = _actions(a, 6, seed=1)
        ra, rb = [a.reset(seed=3)], [b.reset(seed=3)]
        for x in noise:
            ra.append(a.step(x))
            rb.append(b.step(x))
        assert data_equivalence(ra, rb, exact=True)
        assert ra[1][0]["state"] is not ra[2][0]["state"]
        values = [info["value"][info["_value"]] for *_, info in ra[1:] if "value" in info]
        assert values and all(
            np.isfinite(v).all() and (v <= 0).all() for v in values
        )  # the critic's row of each sub-env
    finally:
        a.close()
        b.close()


def test_step_before_reset_and_bad_mode_refused():
    """step() before reset() is ResetNeeded; an autoreset mode gymnasium does not spell so is one line naming the three."""
    env = _vector()
    try:
        with pytest.raises(gym.error.ResetNeeded):
            env.step(env.action_space.sample())
    finally:
        env.close()
    for bad in ("same_step", "next", 1):  # gymnasium's SyncVectorEnv and make_vec take only the enum's values too
        with pytest.raises(
            ConfigError, match=r"autoreset_mode: expected one of 'NextStep' \(AutoresetMode.NEXT_STEP\), "
        ):
            _vector(mode=bad)


def test_make_vec_builds_the_batched_env():
    """``gym.make_vec`` on a registered id builds the batched vector env (shipped models at batch N), seeded and in its space."""
    import rollcap  # noqa: F401  (registers the ids)
    from rollcap.rollout.gym.vector import NoiseSteeringVectorEnv as Ours

    env = gym.make_vec("rollcap/NoiseSteerPushBlock-v0", num_envs=2)
    try:
        assert isinstance(env, Ours) and env.num_envs == 2 and env.core.policy.runner.batch == 2
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        obs, *_ = env.step(np.zeros(env.action_space.shape, np.float32))
        assert env.observation_space.contains(obs)
    finally:
        env.close()


def test_restart_at_a_boundary_continues_that_sub_env_exactly():
    """restart(j, boundary(i)): sub-env j is sub-env i from that boundary on (same noise, same future, bit for bit),
    counted from the root episode (max_chunks ends both at the same chunk); other noise gives another future."""
    env = _vector(NoiseSteeringVectorEnv, AutoresetMode.SAME_STEP)
    try:
        env.reset(seed=11)
        noise = _actions(env, 5, seed=2)
        obs, *_ = env.step(noise[0])
        at = env.boundary(0)
        assert at.chunk == 1 and len(at.prior_values) == 1 and at.origin["parent"] == "live"
        for j in (1, 2):
            o, info = env.restart(j, at)
            assert data_equivalence(o, {k: v[0] for k, v in obs.items()}, exact=True)
            assert info["rollcap_origin"]["chunk"] == 1
        for k, x in enumerate(noise[1:]):
            x = x.copy()
            x[1] = x[0]  # sub-env 1 plays sub-env 0's noise, sub-env 2 its own
            obs, reward, term, trunc, info = env.step(x)
            ends = term | trunc
            seen = info["final_obs"] if ends.any() else [{key: v[i] for key, v in obs.items()} for i in range(N)]
            assert data_equivalence(seen[0], seen[1], exact=True) and reward[0] == reward[1]
            assert not data_equivalence(seen[0], seen[2], exact=True)
            if ends.any():
                break
        assert list(ends) == [True] * N and k == 2  # the root's chunks count: all three end where sub-env 0 would
    finally:
        env.close()


def test_boundary_and_restart_refuse_bad_input():
    env = _vector(NoiseSteeringVectorEnv, AutoresetMode.SAME_STEP)
    try:
        with pytest.raises(gym.error.ResetNeeded, match="sub-env 0"):
            env.boundary(0)
        env.reset(seed=1)
        with pytest.raises(ValueError, match=r"sub-env index must be an integer in \[0, 3\)"):
            env.boundary(3)
        with pytest.raises(TypeError, match="at: expected a Resume"):
            env.restart(0, {"chunk": 0})
        first = env.boundary(0)
        env.restart(1, first)  # a boundary at chunk 0: the episode's own start
    finally:
        env.close()
