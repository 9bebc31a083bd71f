"""What an RL user stacks on the gymnasium envs: gymnasium's wrappers, seeding, recording from a loop, bad actions,
closing (issue 45). Tiny models on the built-in task; the registered ids' own checks are in test_registered.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import error as gym_error
from gymnasium import wrappers
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers import vector as vector_wrappers

import rollcap
from rollcap.critics import CriticRunner, ValueCritic
from rollcap.policies import FlowVLA, PolicyRunner
from rollcap.rollout.batch import row_views
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.envs import ChunkEnv, NoiseSteeringEnv
from rollcap.rollout.gym.vector import ChunkVectorEnv, NoiseSteeringVectorEnv
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.offline.replay import replay_closed, replay_env, replay_policy, summary_line
from rollcap.rollout.recording import EpisodeRecorder
from rollcap.rollout.seeding import episode_seed
from tests.rollout._tiny import CRITIC, POLICY, make_env, make_runners

CFG = HostConfig(max_chunks=6)
SHAPE = (POLICY.horizon, POLICY.action_dim)  # the tiny policy's chunk: (4, 2)


def tiny(cls=NoiseSteeringEnv, **kw):
    p, c = make_runners(seed=2)
    return cls(make_env(), p, c, CFG, **kw)


def batched(n: int):
    torch.manual_seed(0)
    return PolicyRunner(FlowVLA(POLICY).eval(), batch=n), CriticRunner(ValueCritic(CRITIC).eval(), batch=n)


def tiny_vector(cls=NoiseSteeringVectorEnv, n: int = 2, **kw):
    return cls([make_env() for _ in range(n)], *batched(n), CFG, **kw)


def run_episode(env, noise=None) -> dict:
    """Step until the episode ends; the last info."""
    noise = np.zeros(env.action_space.shape, np.float32) if noise is None else noise
    while True:
        *_, term, trunc, info = env.step(noise)
        if term or trunc:
            return info


# -- 1. gymnasium's RecordEpisodeStatistics ------------------------------------------------------------
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_record_episode_statistics_counts_every_episode(mode):
    """The vector RecordEpisodeStatistics adds ``episode`` at each episode's end (rollcap's keys are prefixed)."""
    env = vector_wrappers.RecordEpisodeStatistics(tiny_vector(autoreset_mode=mode))
    try:
        _, info = env.reset(seed=0)
        assert "episode" not in info and info["rollcap_episode"].tolist() == [0, 0]
        ended = 0
        for _ in range(9):
            *_, term, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
            if "episode" in info:
                done = info["_episode"]
                assert (done == (term | trunc)).all() and (info["episode"]["l"][done] >= 1).all()
                ended += int(done.sum())
        assert ended >= 2
    finally:
        env.close()


def test_single_record_episode_statistics_and_clip_action():
    """The single env under RecordEpisodeStatistics and ClipAction: statistics at the end, actions clipped."""
    env = wrappers.RecordEpisodeStatistics(wrappers.ClipAction(tiny(ChunkEnv)))
    env.reset(seed=1)
    info = run_episode(env, np.full(SHAPE, 50.0, np.float32))  # far outside the env's [-1, 1] box
    assert info["episode"]["l"] >= 1 and info["stop_reason"] in ("timeout_chunks", "success", "truncated")
    env.close()


def test_vector_clip_action_over_the_chunk_vector_env():
    """gymnasium's vector ClipAction clips the agent's chunks into the tiled box before the core sees them."""
    env = vector_wrappers.ClipAction(tiny_vector(ChunkVectorEnv))
    try:
        env.reset(seed=0)
        _, r, *_ = env.step(np.full(env.action_space.shape, 50.0, np.float32))
        assert np.isfinite(r).all()
    finally:
        env.close()


# -- TimeLimit ------------------------------------------------------------------------------------------
def test_time_limit_truncation_is_recorded_as_such(tmp_path):
    """An episode cut by gymnasium's TimeLimit is recorded with stop reason time_limit; a caller's own reset: reset."""
    with EpisodeRecorder(tmp_path / "r") as rec:
        env = wrappers.TimeLimit(tiny(subscribers=(rec,)), max_episode_steps=2)
        env.reset(seed=0)
        info = run_episode(env)
        assert info["stop_reason"] == "time_limit" and info["is_success"] is False  # the env ends it where it is cut
        env.reset()  # ends episode 0 (the wrapper's truncation), starts 1
        env.step(np.zeros(SHAPE, np.float32))
        env.reset()  # the caller ends episode 1 after 1 step of 2
        env.close()
    assert [r.stop_reason for r in rollcap.load(tmp_path / "r")] == ["time_limit", "reset"]


def test_vector_max_episode_steps_truncates_with_time_limit():
    """gymnasium has no vector TimeLimit: make_vec(..., max_episode_steps=K) truncates each sub-env after K steps."""
    env = tiny_vector(max_episode_steps=2, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        env.reset(seed=0)
        for k in range(1, 5):
            *_, term, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
            if k % 2 == 0:
                assert trunc.all() and not term.any()
                assert list(info["final_info"]["stop_reason"]) == ["time_limit"] * 2
            else:
                assert not (term | trunc).any()
    finally:
        env.close()
    with pytest.raises(ConfigError, match="max_episode_steps"):
        tiny_vector(max_episode_steps=0)


# -- RecordVideo ----------------------------------------------------------------------------------------
def test_record_video_over_the_single_and_vector_envs(tmp_path):
    """render_mode='rgb_array' shows the image the policy sees: RecordVideo writes a video from either env."""
    pytest.importorskip("moviepy", reason="RecordVideo needs moviepy (the test extra)")
    env = wrappers.RecordVideo(tiny(render_mode="rgb_array"), str(tmp_path / "single"), episode_trigger=lambda e: True)
    obs, _ = env.reset(seed=0)
    assert np.array_equal(env.render(), obs["image_front"])
    run_episode(env)
    env.close()
    venv = vector_wrappers.RecordVideo(tiny_vector(render_mode="rgb_array"), str(tmp_path / "vector"))
    venv.reset(seed=0)
    for _ in range(3):
        venv.step(np.zeros(venv.action_space.shape, np.float32))
    frames = venv.env.render()
    assert len(frames) == 2 and frames[0].shape == (32, 32, 3) and frames[0].dtype == np.uint8
    venv.close()
    assert list((tmp_path / "single").glob("*.mp4")) and list((tmp_path / "vector").glob("*.mp4"))
    with pytest.raises(ValueError, match="render_mode"):
        tiny(render_mode="human")


# -- 3. seeding -----------------------------------------------------------------------------------------
def test_unseeded_resets_draw_from_entropy_and_seeded_runs_repeat():
    """Two fresh envs' unseeded episodes differ; reset(seed=s) then reset() gives episode j of run s."""
    a, b = tiny(), tiny()
    try:
        oa, ia = a.reset()
        ob, ib = b.reset()
        assert ia["rollcap_seed"] != ib["rollcap_seed"] and not np.array_equal(oa["state"], ob["state"])
        _, i0 = a.reset(seed=7)
        _, i1 = a.reset()
        assert (i0["rollcap_episode"], i0["rollcap_seed"]) == (0, episode_seed(7, 0))
        assert (i1["rollcap_episode"], i1["rollcap_seed"]) == (1, episode_seed(7, 1))
        assert [ia["rollcap_index"], i0["rollcap_index"], i1["rollcap_index"]] == [0, 1, 2]
        o7, _ = b.reset(seed=7)
        assert np.array_equal(o7["state"], a.reset(seed=7)[0]["state"])
    finally:
        a.close()
        b.close()


def test_vector_sub_envs_differ_unseeded_and_get_seed_plus_i_seeded():
    """Unseeded sub-envs start different episodes; reset(seed=s) gives sub-env i the run s + i, as SyncVectorEnv."""
    env = tiny_vector(n=3)
    try:
        obs, info = env.reset()
        assert len(set(info["rollcap_seed"].tolist())) == 3
        assert len({obs["state"][i].tobytes() for i in range(3)}) == 3
        _, info = env.reset(seed=10)
        assert info["rollcap_seed"].tolist() == [episode_seed(10 + i, 0) for i in range(3)]
        assert info["rollcap_index"].tolist() == [3, 4, 5]
    finally:
        env.close()


# -- 4. recording from a training or evaluation loop ---------------------------------------------------
def _replays(records, policy, critic) -> list:
    out = []
    for r in records:
        out += [replay_policy(r, policy, critic), replay_env(r, make_env())]
        out.append(replay_closed(r, None))  # the agent chose the noise: closed mode does not apply, runs nothing
    return out


def test_seeded_evaluation_loop_records_every_episode_and_they_replay(tmp_path):
    """reset(seed=100 + k) with a recorder: unique indices, seeds recorded, every applicable mode exact."""
    rng = np.random.default_rng(0)
    with EpisodeRecorder(tmp_path / "r") as rec:
        env = tiny(subscribers=(rec,))
        for k in range(3):
            env.reset(seed=100 + k)
            run_episode(env, rng.standard_normal(SHAPE).astype(np.float32))
        env.reset()  # the next episode of run 102, cut by the caller: recorded too
        env.step(np.zeros(SHAPE, np.float32))
        env.reset()
        env.close()  # abandons the running episode: nothing recorded
    records = rollcap.load(tmp_path / "r")
    assert [r.index for r in records] == [0, 1, 2, 3]
    assert [r.seed for r in records] == [*(episode_seed(100 + k, 0) for k in range(3)), episode_seed(102, 1)]
    assert records[3].stop_reason == "reset"
    results = _replays(records, *make_runners(seed=2))
    closed = [r for r in results if r.mode == "closed"]
    assert all(r.exact for r in results if r.mode != "closed")
    assert all(r.status == "not comparable" and "actions came from the caller" in r.line() for r in closed)
    line, ok = summary_line(results)
    assert ok, line
    assert not summary_line(closed)[1]  # nothing checked is no pass


def test_recorder_added_to_host_subscribers_later_records(tmp_path):
    """A recorder appended to env.host.subscribers after construction records the episodes that start after it."""
    env = tiny()
    with EpisodeRecorder(tmp_path / "r") as rec:
        env.host.subscribers.append(rec)
        env.reset(seed=3)
        run_episode(env)
        env.close()
    assert [r.seed for r in rollcap.load(tmp_path / "r")] == [episode_seed(3, 0)]


def test_vector_env_records_its_sub_envs_and_they_replay(tmp_path):
    """subscribers= on the vector env: every sub-env's episodes recorded under unique indices, time limits named."""
    rng = np.random.default_rng(1)
    with EpisodeRecorder(tmp_path / "r") as rec:
        env = tiny_vector(subscribers=(rec,), max_episode_steps=3)
        env.reset(seed=0)
        for _ in range(7):
            env.step(rng.standard_normal(env.action_space.shape).astype(np.float32))
        env.close()
    records = rollcap.load(tmp_path / "r")
    assert len(records) >= 4 and len({r.index for r in records}) == len(records)
    assert {r.stop_reason for r in records} <= {"time_limit", "success"} and "time_limit" in {
        r.stop_reason for r in records
    }
    results = _replays(records, *row_views(*batched(2)))
    line, ok = summary_line(results)
    assert ok, line


def test_sync_vector_env_sub_envs_share_a_recorder_and_a_resumed_run_goes_on(tmp_path):
    """SyncVectorEnv of single envs behind TimeLimit, one recorder: indices unique across sub-envs, time limits named;
    a second loop on the same run directory (resume=True) continues after the recorded indices."""
    from gymnasium.vector import SyncVectorEnv

    def loop(rec, steps: int) -> None:
        env = SyncVectorEnv([lambda: wrappers.TimeLimit(tiny(subscribers=(rec,)), 2) for _ in range(2)])
        env.reset(seed=0)
        for _ in range(steps):
            env.step(np.zeros(env.action_space.shape, np.float32))
        env.close()

    with EpisodeRecorder(tmp_path / "r") as rec:
        loop(rec, 6)  # next-step autoreset: TimeLimit cuts at steps 2 and 5, each episode recorded where it is cut
    first = rollcap.load(tmp_path / "r")
    with EpisodeRecorder(tmp_path / "r", resume=True) as rec:
        loop(rec, 3)
    records = rollcap.load(tmp_path / "r")
    assert [r.index for r in first] == [0, 1, 2, 3] and [r.index for r in records] == [0, 1, 2, 3, 4, 5]
    assert {r.stop_reason for r in records} == {"time_limit"}


# -- 5. bad actions, a closed env -----------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ChunkEnv, NoiseSteeringEnv])
def test_bad_actions_are_refused_saying_what_is_wrong(cls):
    """A chunk of the wrong shape is refused (never reshaped); NaN is named non-finite; a closed env says so."""
    env = tiny(cls)
    env.reset(seed=0)
    for bad in (np.zeros((2, 4), np.float32), np.zeros(8, np.float32)):
        with pytest.raises(ValueError, match=rf"expected shape \(4, 2\), got \({bad.shape[0]},"):
            env.step(bad)
    nan = np.zeros(SHAPE, np.float32)
    nan[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"non-finite value nan at index \(1, 0\)"):
        env.step(nan)
    assert env.step(np.zeros(SHAPE, np.float32))[4]["steps"] == 4  # the episode goes on after a refusal
    env.close()
    with pytest.raises(gym_error.ClosedEnvironmentError, match="the env is closed"):
        env.step(np.zeros(SHAPE, np.float32))
    with pytest.raises(gym_error.ClosedEnvironmentError, match="the env is closed"):
        env.reset()


def test_vector_bad_actions_and_closed_env_refused():
    env = tiny_vector()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions: expected shape \(2, 4, 2\), got \(8, 2\)"):
        env.step(np.zeros((8, 2), np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        env.step(np.full((2, 4, 2), np.inf, np.float32))
    env.close()
    with pytest.raises(gym_error.ClosedEnvironmentError, match="the env is closed"):
        env.step(np.zeros((2, 4, 2), np.float32))


# -- noise bound, state-only observations ----------------------------------------------------------------
def test_noise_bound_and_state_only_options():
    """noise_bound narrows the action box and clips to it; state_only leaves the agent the state alone."""

    class Noise(Subscriber):
        def __init__(self):
            self.seen = []

        def on_chunk(self, chunk):
            self.seen.append(chunk.noise)

    seen = Noise()
    env = tiny(noise_bound=1.5, state_only=True, value_in_obs=True, subscribers=(seen,))
    try:
        assert env.action_space.high.max() == 1.5 and set(env.observation_space.spaces) == {"state", "value"}
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        env.step(np.full(SHAPE, 9.0, np.float32))
        assert len(seen.seen) == 1 and np.array_equal(seen.seen[0], np.full(SHAPE, 1.5, np.float32))
    finally:
        env.close()
    venv = tiny_vector(noise_bound=1.5, state_only=True)
    try:
        assert venv.single_action_space.high.max() == 1.5 and set(venv.single_observation_space.spaces) == {"state"}
        obs, _ = venv.reset(seed=0)
        assert venv.observation_space.contains(obs)
    finally:
        venv.close()
    for bad in (0, -1.0, 5.0, True):
        with pytest.raises(ConfigError, match="noise_bound"):
            tiny(noise_bound=bad)


def test_host_boundary_names_non_finite_noise():
    """A caller's NaN noise handed to the host itself is named non-finite (it said "expected finite float32")."""
    env = tiny()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"boundary\(noise\): non-finite values \(NaN or inf\) in 8 places"):
        env.host.boundary(np.full(SHAPE, np.nan, np.float32))
    assert env.step(np.zeros(SHAPE, np.float32))[4]["steps"] == 4
    env.close()
