"""What an RL user's tools read from the envs (issue 59): success under a time limit, reset masks and autoreset modes,
a recorder shared by a train and an eval env, residual RL on ChunkEnv, SB3 on the batched core."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import wrappers
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.utils.env_checker import data_equivalence

import rollcap
from rollcap.critics import CriticRunner, ValueCritic
from rollcap.policies import FlowVLA, PolicyRunner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.gym.envs import ChunkEnv, NoiseSteeringEnv
from rollcap.rollout.gym.vector import ChunkVectorEnv, NoiseSteeringVectorEnv
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.offline.replay import replay_env, replay_policy
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.recording import EpisodeRecorder
from rollcap.rollout.seeding import episode_seed
from tests.rollout._tiny import CRITIC, POLICY, make_env, make_runners

SHAPE = (POLICY.horizon, POLICY.action_dim)  # the tiny policy's chunk: (4, 2)


def tiny(cls=NoiseSteeringEnv, config=None, **kw):
    p, c = make_runners(seed=2)
    return cls(make_env(), p, c, config or HostConfig(max_chunks=6), **kw)


def tiny_vector(cls=NoiseSteeringVectorEnv, n: int = 3, config=None, **kw):
    torch.manual_seed(0)
    p, c = FlowVLA(POLICY).eval(), ValueCritic(CRITIC).eval()
    runners = [PolicyRunner(p, batch=n), CriticRunner(c, batch=n)]
    return cls([make_env() for _ in range(n)], *runners, config or HostConfig(max_chunks=6), owns=runners, **kw)


class Outcomes(Subscriber):
    """Every episode's end as the host saw it: the truth a logger's success rate is checked against."""

    def __init__(self):
        self.ends = []

    def on_episode_end(self, end) -> None:
        self.ends.append(end)


# -- 1. is_success wherever a logger looks, a time limit included ---------------------------------------------------
@pytest.mark.parametrize("cls", [ChunkEnv, NoiseSteeringEnv])
def test_is_success_is_in_every_step_and_a_time_limit_cut_names_its_stop(cls):
    """is_success at every step (gymnasium-robotics' convention); the step a TimeLimit cuts carries stop_reason
    time_limit and is_success, and the env has ended the episode there (a further step needs a reset)."""
    env = wrappers.TimeLimit(tiny(cls), max_episode_steps=2)
    try:
        env.reset(seed=0)
        *_, term, trunc, info = env.step(np.zeros(SHAPE, np.float32))
        assert info["is_success"] is False and "stop_reason" not in info and not (term or trunc)
        *_, term, trunc, info = env.step(np.zeros(SHAPE, np.float32))
        assert (trunc, term, info["stop_reason"], info["is_success"]) == (True, False, "time_limit", False)
        assert env.unwrapped.host.state.value == "reset"
    finally:
        env.close()


def _final_infos(step_results) -> list[tuple[str, bool]]:
    """(stop_reason, is_success) of every episode a same-step vector run ended, in sub-env order per step."""
    out = []
    for *_, term, trunc, info in step_results:
        for i in np.flatnonzero(term | trunc):
            fin = info["final_info"]
            assert fin["_is_success"][i] and fin["_stop_reason"][i], fin
            out.append((str(fin["stop_reason"][i]), bool(fin["is_success"][i])))
    return out


@pytest.mark.slow(seconds=40)
def test_success_and_stop_reason_are_the_same_in_every_vector_mode():
    """The batched vector env (max_episode_steps), gymnasium's sync and async vector envs over TimeLimit'd single
    envs: every ended episode's final_info carries the same stop_reason and is_success (sync's had neither)."""
    noise = np.random.default_rng(0).standard_normal((7, 2, *SHAPE)).astype(np.float32)

    def run(env) -> list[tuple[str, bool]]:
        try:
            env.reset(seed=[3, 4])
            return _final_infos([env.step(a) for a in noise])
        finally:
            env.close()

    single = lambda: wrappers.TimeLimit(tiny(), max_episode_steps=3)  # noqa: E731
    batched = run(tiny_vector(n=2, max_episode_steps=3, autoreset_mode=AutoresetMode.SAME_STEP))
    sync = run(SyncVectorEnv([single, single], autoreset_mode=AutoresetMode.SAME_STEP))
    asynch = run(gym.vector.AsyncVectorEnv([single, single], autoreset_mode=AutoresetMode.SAME_STEP))
    assert batched == sync == asynch and len(batched) == 4 and {r for r, _ in batched} == {"time_limit"}


def _sb3_success_rate(model_env, episodes_at_least: int) -> tuple[float, list]:
    """SAC acting at random (no update yet) on ``model_env`` until that many episodes ended; SB3's logged success
    rate after the last one, and the env's own outcomes."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.logger import KVWriter, Logger

    class Capture(KVWriter):
        """An SB3 logger output that keeps what it is given (its success rate, as SB3 computes it)."""

        def __init__(self):
            self.rows = []

        def write(self, key_values, key_excluded, step=0) -> None:
            self.rows.append(dict(key_values))

    capture = Capture()
    model = SAC("MultiInputPolicy", model_env, learning_starts=10**6, seed=0, device="cpu", buffer_size=1000)
    model.set_logger(Logger(None, [capture]))
    model.learn(episodes_at_least * 6, log_interval=1)
    rates = [r["rollout/success_rate"] for r in capture.rows if "rollout/success_rate" in r]
    return rates[-1], model


@pytest.mark.slow(seconds=40)
def test_sb3s_success_rate_is_the_true_rate_under_a_time_limit():
    """The issue's run: SAC's logger on NoiseSteerPushBlock-v0 cut at 6 chunks reported success_rate 1.00 where 16/100
    succeeded (a TimeLimit cut carried no is_success, so SB3 left the failures out). Now its rate is the episodes'
    true rate, through SB3's DummyVecEnv over gym.make and through SB3VecEnv over the batched core."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rollcap.rollout.gym.sb3 import make_sb3_vec_env

    kw = {"state_only": True, "noise_bound": 1.5, "max_episode_steps": 6}
    truth = Outcomes()
    env = DummyVecEnv([lambda: gym.make("rollcap/NoiseSteerPushBlock-v0", subscribers=(truth,), **kw)])
    rate, model = _sb3_success_rate(env, 40)
    env.close()
    ended = truth.ends[-len(model.ep_success_buffer) :]  # SB3 keeps the last 100
    true = sum(e.success for e in ended) / len(ended)
    assert len(ended) >= 40 and 0 < true < 0.5 and rate == pytest.approx(true), (rate, true)
    truth = Outcomes()
    venv = make_sb3_vec_env("rollcap/NoiseSteerPushBlock-v0", n_envs=2, subscribers=(truth,), **kw)
    rate, model = _sb3_success_rate(venv, 20)
    venv.close()
    finished = [e.success for e in truth.ends[-len(model.ep_success_buffer) :]]
    assert len(finished) >= 20 and rate == pytest.approx(sum(finished) / len(finished)), (rate, finished)


# -- 2. reset masks and autoreset modes ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [NoiseSteeringVectorEnv, ChunkVectorEnv])
def test_reset_mask_resets_only_the_masked_sub_envs(cls):
    """reset(options={"reset_mask": m}) resets the masked sub-envs alone (their next episode); the others go on exactly
    as a twin that was not reset, and only the reset ones have reset infos. A bad mask is one line."""
    a, b = tiny_vector(cls), tiny_vector(cls)
    try:
        rng = np.random.default_rng(0)
        actions = [rng.uniform(-1, 1, a.action_space.shape).astype(np.float32) for _ in range(3)]
        for env in (a, b):
            env.reset(seed=0)
            env.step(actions[0])
        obs, info = a.reset(options={"reset_mask": np.array([True, False, False])})
        assert info["rollcap_episode"].tolist() == [1, 0, 0] and info["_rollcap_episode"].tolist() == [
            True,
            False,
            False,
        ]
        assert info["rollcap_seed"][0] == episode_seed(0, 1)
        for x, y in zip(a.step(actions[1])[:4], b.step(actions[1])[:4]):
            keep = (lambda v: {k: w[1:] for k, w in v.items()}) if isinstance(x, dict) else (lambda v: v[1:])
            assert data_equivalence(keep(x), keep(y), exact=True)
        for bad, err, what in (
            ([True, False, False], TypeError, "expected a numpy bool array of shape \\(3,\\), got list"),
            (np.array([1, 0, 0]), TypeError, "expected a numpy bool array of shape \\(3,\\), got dtype int64"),
            (np.array([True, False]), ValueError, "expected shape \\(3,\\), got \\(2,\\)"),
            (np.zeros(3, bool), ValueError, "expected at least one True"),
        ):
            with pytest.raises(err, match=rf"^options\['reset_mask'\]: {what}"):
                a.reset(options={"reset_mask": bad})
    finally:
        a.close()
        b.close()


def test_autoreset_disabled_waits_for_a_masked_reset():
    """AutoresetMode.DISABLED (or "Disabled"): an ended sub-env is not reset by the env; a step before the caller
    resets it is refused naming it; reset_mask resets it and the run goes on, as SyncVectorEnv's Disabled mode."""
    env = tiny_vector(n=2, config=HostConfig(max_chunks=2), autoreset_mode="Disabled")
    try:
        assert env.metadata["autoreset_mode"] is AutoresetMode.DISABLED
        env.reset(seed=0)
        zero = np.zeros(env.action_space.shape, np.float32)
        for _ in range(3):  # two chunks, then the third boundary stops them (max_chunks)
            *_, term, trunc, info = env.step(zero)
        assert (term | trunc).all() and "final_info" not in info and list(info["stop_reason"]) == ["timeout_chunks"] * 2
        with pytest.raises(gym.error.ResetNeeded, match=r"sub-envs \[0, 1\] ended and autoreset_mode is Disabled"):
            env.step(zero)
        _, info = env.reset(options={"reset_mask": np.array([True, False])})
        with pytest.raises(gym.error.ResetNeeded, match=r"sub-envs \[1\] ended"):
            env.step(zero)
        env.reset(options={"reset_mask": np.array([False, True])})
        *_, term, trunc, info = env.step(zero)
        assert not (term | trunc).any() and info["steps"].tolist() == [4, 4]
    finally:
        env.close()


# -- 3. a recorder shared by a train env and an eval env ------------------------------------------------------------
def test_a_recorder_shared_by_a_train_and_an_eval_env_records_both(tmp_path):
    """One EpisodeRecorder for a train env and an eval env: closing the train env leaves it open (whoever opened it
    closes it), the eval env records on, indices never collide, and every episode replays exact."""
    with EpisodeRecorder(tmp_path / "r") as rec:
        train, evaluate = tiny(subscribers=(rec,)), tiny(ChunkEnv, subscribers=(rec,))
        train.reset(seed=1)
        while not any(train.step(np.full(SHAPE, 0.3, np.float32))[2:4]):
            pass
        train.close()
        for seed in (7, 8):
            obs, _ = evaluate.reset(seed=seed)
            while not any((out := evaluate.step(obs["policy_chunk"]))[2:4]):
                obs = out[0]
        evaluate.close()
        assert not rec._closed  # the envs leave it to its opener
    records = rollcap.load(tmp_path / "r")
    assert [r.index for r in records] == [0, 1, 2] and [r.seed for r in records] == [
        episode_seed(1, 0),
        episode_seed(7, 0),
        episode_seed(8, 0),
    ]
    p, c = make_runners(seed=2)
    assert all(replay_policy(r, p, c).exact and replay_env(r, make_env()).exact for r in records)


@pytest.mark.slow(seconds=40)
def test_make_vec_async_with_a_recorder_refuses_in_one_line_at_the_first_reset(tmp_path):
    """gym.make_vec(..., vectorization_mode="async", subscribers=(rec,)): the throwaway env gymnasium builds and closes
    first no longer closes the recorder, and the workers' copies refuse at the first reset in one line (they would
    write the same indices into one directory); nothing is recorded, and the recorder still records here."""
    with EpisodeRecorder(tmp_path / "r") as rec:
        venv = gym.make_vec(
            "rollcap/NoiseSteerPushBlock-v0",
            num_envs=2,
            vectorization_mode="async",
            subscribers=(rec,),
            state_only=True,
        )
        try:
            with warnings.catch_warnings(record=True) as said:  # gymnasium reports each worker's error as it stops it
                warnings.simplefilter("always")
                with pytest.raises(
                    RuntimeError, match=r"EpisodeRecorder was opened in process \d+ and is used in"
                ) as e:
                    venv.reset(seed=0)
            assert "\n" not in str(e.value) and "vectorization_mode='sync'" in str(e.value)
            assert any("Received the following error from Worker" in str(w.message) for w in said)
        finally:
            venv.close(terminate=True)
        assert not list((tmp_path / "r" / "episodes").iterdir())
        env = tiny(subscribers=(rec,))
        env.reset(seed=0)
        env.step(np.zeros(SHAPE, np.float32))
        env.reset()
        env.close()
    assert len(rollcap.load(tmp_path / "r")) == 1


# -- 4. residual RL on ChunkEnv ----------------------------------------------------------------------------------------
class _Records(Subscriber):
    wants_records = True

    def __init__(self):
        self.records = []

    def on_episode_end(self, end) -> None:
        self.records.append(end.record)


@pytest.mark.parametrize("residual", [None, 0.25])
def test_a_zero_residual_is_the_frozen_policy_episode_for_episode(residual):
    """ChunkEnv's observation holds the policy's chunk for it; acting it (a zero residual; with ``residual=s``, the
    action 0) gives the frozen policy's episodes (`rollcap run` with the same config), observation, action, reward and
    stop for each, and execute_steps is honoured (2 of the chunk's 4 rows). It was the chunk for the observation
    already acted on, one step late, and all 4 rows ran."""
    config = HostConfig(max_chunks=5, execute_steps=2)
    seen = _Records()
    env = tiny(ChunkEnv, config=config, subscribers=(seen,), residual=residual)
    act = (lambda obs: obs["policy_chunk"]) if residual is None else (lambda obs: np.zeros(SHAPE, np.float32))
    p, c = make_runners(seed=2)
    frozen = RolloutHost(make_env(), p, c, config)
    try:
        assert env.observation_space["policy_chunk"].shape == SHAPE and env.execute_steps == 2
        for seed in (0, 1, 2):
            obs, info = env.reset(seed=seed)
            steps = []
            while True:
                obs, _, term, trunc, info = env.step(act(obs))
                steps.append(info["steps"])
                if term or trunc:
                    break
            want = frozen.run_episode(0, info_seed := episode_seed(seed, 0)).record
            got = seen.records[-1]
            assert got.seed == info_seed and (got.stop_reason, got.success) == (want.stop_reason, want.success)
            assert steps[:-1] == [2] * (len(steps) - 1) and steps[-1] <= 2
            for table, keys in (("steps", ("actions", "rewards", "terminated", "truncated")), ("chunks", ("noise", "policy_chunk"))):  # fmt: skip
                for k in keys:
                    assert np.array_equal(getattr(got, table)[k], getattr(want, table)[k]), (seed, k)
            assert all(np.array_equal(got.obs[k], want.obs[k]) for k in want.obs)
    finally:
        env.close()
        frozen.close()


def test_a_residual_vector_env_starts_as_the_frozen_policy():
    """ChunkVectorEnv(residual=s): the action is a residual in [-1, 1] (clipped), executed on top of each sub-env's
    plan; the zero action gives the same episodes as acting the plans themselves, and a bad scale is one line."""
    plain, resid = tiny_vector(ChunkVectorEnv, n=2), tiny_vector(ChunkVectorEnv, n=2, residual=0.5)
    try:
        assert resid.single_action_space.low.min() == -1.0 and resid.single_action_space.high.max() == 1.0
        o1, _ = plain.reset(seed=3)
        o2, _ = resid.reset(seed=3)
        for _ in range(4):
            r1, r2 = plain.step(o1["policy_chunk"]), resid.step(np.zeros(resid.action_space.shape, np.float32))
            assert all(data_equivalence(x, y, exact=True) for x, y in zip(r1[:4], r2[:4]))
            o1 = r1[0]
    finally:
        plain.close()
        resid.close()
    for bad in (0, -1.0, True, "0.1"):
        with pytest.raises(ConfigError, match="^residual: expected None or a number > 0"):
            tiny(ChunkEnv, residual=bad)


# -- 6. SB3 on the batched core ----------------------------------------------------------------------------------------
@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("cls", [NoiseSteeringVectorEnv, ChunkVectorEnv])
def test_sb3_sac_and_ppo_train_on_the_batched_core(cls):
    """SB3's SAC and PPO take SB3VecEnv over a rollcap vector env (one graph at batch N, captured once): they train,
    SB3's obs are the vector env's, and a finished sub-env's info has its terminal observation and TimeLimit.truncated."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import VecMonitor

    from rollcap.kernels.graph import capture_count
    from rollcap.rollout.gym.sb3 import SB3VecEnv

    before = capture_count()
    inner = tiny_vector(cls, n=2, config=HostConfig(max_chunks=3), state_only=True, autoreset_mode="SameStep")
    assert capture_count() - before == 2  # one policy graph and one critic graph at batch 2
    twin = tiny_vector(cls, n=2, config=HostConfig(max_chunks=3), state_only=True, autoreset_mode="SameStep")
    venv = SB3VecEnv(inner)
    try:
        venv.seed(5)
        obs = venv.reset()
        assert data_equivalence(obs, twin.reset(seed=5)[0], exact=True)
        actions = np.zeros((2, *SHAPE), np.float32)
        for _ in range(3 if cls is ChunkVectorEnv else 4):  # a 4th boundary stops the noise env (no lookahead)
            obs, rewards, dones, infos = venv.step(actions)
            want = twin.step(actions)
            assert data_equivalence(obs, want[0], exact=True) and np.array_equal(rewards, want[1].astype(np.float32))
        assert dones.all() and all(i["TimeLimit.truncated"] and "terminal_observation" in i for i in infos)
        assert all(i["stop_reason"] == "timeout_chunks" and i["is_success"] is False for i in infos)
        assert [r["rollcap_episode"] for r in venv.reset_infos] == [1, 1]
        env = VecMonitor(venv)
        sb3.PPO("MultiInputPolicy", env, n_steps=4, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(8)
        model = sb3.SAC("MultiInputPolicy", env, learning_starts=4, batch_size=8, buffer_size=100, seed=0, device="cpu")
        model.learn(12)
        assert len(model.ep_success_buffer) >= 2
    finally:
        venv.close()
        twin.close()


def test_sb3_vec_env_refuses_what_it_cannot_drive():
    """A next-step vector env, or something that is not rollcap's vector env: one line each."""
    pytest.importorskip("stable_baselines3")
    from rollcap.rollout.gym.sb3 import SB3VecEnv

    env = tiny_vector(n=2)
    try:
        with pytest.raises(ConfigError, match="autoreset_mode: SB3 resets a finished sub-env within the step"):
            SB3VecEnv(env)
    finally:
        env.close()
    with pytest.raises(TypeError, match="venv: expected a rollcap vector env"):
        SB3VecEnv(SyncVectorEnv([make_env]))


# -- 7. normalising the Dict observation --------------------------------------------------------------------------------
def test_normalize_observation_recipes_from_the_readme_work():
    """gymnasium's NormalizeObservation wants a Box: FlattenObservation first (single and vector, as README says);
    SB3's VecNormalize takes the Dict as it is (norm_obs_keys)."""
    env = wrappers.NormalizeObservation(wrappers.FlattenObservation(tiny(state_only=True)))
    try:
        obs, _ = env.reset(seed=0)
        obs, *_ = env.step(np.zeros(SHAPE, np.float32))
        assert obs.shape == (28,) and np.isfinite(obs).all()
    finally:
        env.close()
    from gymnasium.wrappers import vector as vector_wrappers

    venv = vector_wrappers.NormalizeObservation(vector_wrappers.FlattenObservation(tiny_vector(n=2, state_only=True)))
    try:
        venv.reset(seed=0)
        obs, *_ = venv.step(np.zeros((2, *SHAPE), np.float32))
        assert obs.shape == (2, 28) and np.isfinite(obs).all()
    finally:
        venv.close()
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import VecNormalize

    from rollcap.rollout.gym.sb3 import SB3VecEnv

    sb3 = VecNormalize(SB3VecEnv(tiny_vector(n=2, autoreset_mode="SameStep")), norm_obs_keys=["state"])
    try:
        sb3.reset()
        obs, *_ = sb3.step(np.zeros((2, *SHAPE), np.float32))
        assert np.abs(obs["state"]).max() <= sb3.clip_obs and obs["image_front"].dtype == np.uint8
    finally:
        sb3.close()
