"""DSRL on the batched vector env (rollout/learn/dsrl_na.py, dsrl_heldin.py, noise_agent.py): both variants learn a
bandit whose reward depends on the noise only through an aliased action; the entropy guard and keep-best hold on a
bandit whose rewarded region moves; the loop stores what the env executed and scores a held-in stream; a seed repeats
a run bit for bit; a zero-noise actor scores exactly as the zero-noise baseline; the example runs at its smallest."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rollcap.rollout.learn.dsrl_branch import Branches
from rollcap.rollout.learn.dsrl_heldin import HELDIN_SEED_BASE, KeepBest, TRAIN_SEED_BASE
from rollcap.rollout.learn.dsrl_eval import TASKS, baseline, evaluate, held_out
from rollcap.rollout.learn.dsrl_na import TrainConfig, n_step_rows, train
from rollcap.rollout.learn.noise_agent import AgentConfig, NoiseAgent, ReplayBuffer

ROOT = Path(__file__).resolve().parents[3]
TINY = AgentConfig(hidden=32, layers=2, batch=64, init_alpha=0.01, target_entropy=-4.0)


@pytest.mark.parametrize("algorithm", ["na", "sac"])
def test_agent_learns_an_aliased_bandit(algorithm):
    """A one-step task: the executed action is the noise's sign pattern (many noises alias one action) and the reward
    is 1 where the action matches the observation's sign. Both variants' deterministic noise ends on the rewarded side."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: a second thread only contends
    try:
        _bandit(algorithm)
    finally:
        torch.set_num_threads(threads)


def _bandit(algorithm: str) -> None:
    cfg = AgentConfig(**{**TINY.to_json(), "algorithm": algorithm, "lr": 3e-3})
    agent = NoiseAgent(2, 2, 2, cfg, seed=0)
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(5000, 2, 2, 2)

    def step(obs, noise):
        action = np.sign(noise)
        return action, (action == np.sign(obs)).all(1).astype(np.float32)

    for it in range(600):
        obs = rng.choice([-1.0, 1.0], (8, 2)).astype(np.float32)
        noise = rng.uniform(-1.5, 1.5, (8, 2)).astype(np.float32) if it < 100 else agent.act(obs, deterministic=False)
        action, reward = step(obs, noise)
        for i in range(8):
            buf.add(
                obs=obs[i], noise=noise[i], action=action[i], reward=reward[i], done=1.0, next_obs=obs[i], ready=1.0
            )
        if it >= 20:
            agent.critic_step(buf.sample(rng, 64))
            if algorithm == "na":
                agent.distill_step(buf.sample(rng, 64))
            agent.actor_step(buf.sample(rng, 64))
    test = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], np.float32)
    _, reward = step(test, agent.act(test, deterministic=True))
    assert reward.all(), (algorithm, agent.act(test, deterministic=True))


@functools.lru_cache
def _moving_bandit(alpha_min: float) -> dict:
    """A one-step task whose rewarded region moves: the executed action is tanh(noise), rewarded within 0.3 (max norm)
    of 0.5 x sign(obs) for 400 iterations, then of 0 (where the policy's own noise is densest). Held-in: the four
    contexts scored on the first region (the task the user cares about; the moved reward stands for training data that
    stopped agreeing with it, as the collapsed peg run's did). Returns the final agent's scores on both regions, the
    kept agent's on the first, and the iteration it was kept at."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = AgentConfig(
            **{**TINY.to_json(), "lr": 3e-3, "init_alpha": 0.1, "target_entropy": -10.0, "alpha_min": alpha_min}
        )
        agent = NoiseAgent(2, 2, 2, cfg, seed=0)
        rng = np.random.default_rng(0)
        buf = ReplayBuffer(2000, 2, 2, 2)
        test = np.array([[1, 1], [1, -1], [-1, 1], [-1, -1]], np.float32)

        def score(obs, noise, centre):
            return (np.abs(np.tanh(noise) - centre * np.sign(obs)).max(1) < 0.3).astype(np.float32)

        keep = KeepBest()
        for it in range(1000):
            centre = 0.5 if it < 400 else 0.0
            obs = rng.choice([-1.0, 1.0], (8, 2)).astype(np.float32)
            noise = (
                rng.uniform(-1.5, 1.5, (8, 2)).astype(np.float32) if it < 100 else agent.act(obs, deterministic=False)
            )
            reward = score(obs, noise, centre)
            for i in range(8):
                buf.add(
                    obs=obs[i],
                    noise=noise[i],
                    action=np.tanh(noise[i]),
                    reward=reward[i],
                    done=1.0,
                    next_obs=obs[i],
                    ready=1.0,
                )
            if it >= 20:
                agent.critic_step(buf.sample(rng, 64))
                agent.distill_step(buf.sample(rng, 64))
                stats = agent.actor_step(buf.sample(rng, 64))
            if it % 100 == 99:
                keep.offer(agent, {"iteration": it, "success": int(score(test, agent.act(test, True), 0.5).sum())})
        w = agent.act(test, True)
        out = {
            "moved": int(score(test, w, 0.0).sum()),
            "first": int(score(test, w, 0.5).sum()),
            "alpha": stats["alpha"],
        }
        keep.restore(agent)
        return {
            **out,
            "kept_first": int(score(test, agent.act(test, True), 0.5).sum()),
            "kept_at": keep.point["iteration"],
        }
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow(seconds=30)
def test_the_entropy_guard_keeps_the_agent_exploring_when_its_reward_moves():
    """With the entropy coefficient free (the published tuning, target far below), it decays to ~0.004 and the agent,
    no longer exploring, does not find the moved region; with ``alpha_min`` it does, on every context."""
    free, guarded = _moving_bandit(0.0), _moving_bandit(0.08)
    assert free["alpha"] < 0.01 and guarded["alpha"] >= 0.08 * (1 - 1e-6), (free, guarded)
    assert free["moved"] <= 2, free  # collapsed: at most half the contexts on the moved region
    assert guarded["moved"] == 4, guarded


@pytest.mark.slow(seconds=30)
def test_keep_best_ends_with_the_best_held_in_checkpoint():
    """The guarded agent follows the moved reward and scores 0 of 4 held-in at the end; the kept copy is the last
    checkpoint that still scored 4 of 4, and says when it was kept."""
    run = _moving_bandit(0.08)
    assert run["first"] == 0 and run["kept_first"] == 4 and run["kept_at"] < 999, run


def test_a_held_in_line_names_the_kept_checkpoint_when_it_is_not_this_one():
    from rollcap.rollout.learn.dsrl_heldin import line

    base = {"episodes": 64, "rank_agreement": None, "ranked_pairs": 0, "zero_noise": 46, "own_noise": 42, "fixed": 2,
            "broken": 3, "alpha": 0.01, "entropy": 30.0}  # fmt: skip
    kept = {**base, "minutes": 22.8, "transitions": 50_000, "success": 57, "kept": True}
    fell = {**base, "minutes": 27.1, "transitions": 60_000, "success": 45, "kept": False}
    assert line(kept).endswith("<- kept") and line(kept, kept).endswith("<- kept")
    assert line(fell, kept).endswith("(kept: minute 22.8, 57/64: 12 more successes than this one)")
    assert "kept" not in line(fell)  # keep-best off: nothing to name


def test_replay_holds_back_the_action_target_until_the_next_chunk_is_known():
    buf = ReplayBuffer(4, 1, 2, 2)
    i = buf.add(obs=[0.0], noise=[1, 2], action=[3, 4], reward=0.0, done=0.0, next_obs=[1.0])
    assert buf.data["ready"][i] == 0.0
    buf.complete(i, np.array([5, 6], np.float32))
    assert buf.data["ready"][i] == 1.0 and buf.data["next_action"][i].tolist() == [5, 6]
    for _ in range(5):  # a ring: the oldest slot is overwritten
        buf.add(obs=[2.0], ready=1.0)
    assert buf.size == 4 and (buf.data["obs"][:, 0] == 2.0).all()


def test_n_step_rows_sum_the_rewards_and_bootstrap_from_n_chunks_on():
    """A 5-chunk episode that succeeds on its last chunk, n = 3: each row enters the buffer once its 3 next chunks
    are known (its next state and chunk are the third one's, discount gamma^3), the rest when the episode ends."""
    g, buf, win = 0.5, ReplayBuffer(16, 1, 1, 1), []
    rewards = [0.0, 0.0, 0.0, 0.25, 1.0]
    for t, r in enumerate(rewards):
        win.append((np.float32([t]), np.float32([10 + t]), np.float32([20 + t]), r))
        n_step_rows(buf, win, 3, g, done=t == 4, final_obs=np.float32([99]))
        assert buf.size == (max(0, t - 2) if t < 4 else 5)
    d = {k: v[: buf.size] for k, v in buf.data.items()}
    assert d["obs"][:, 0].tolist() == [0, 1, 2, 3, 4] and d["action"][:, 0].tolist() == [20, 21, 22, 23, 24]
    assert d["reward"].tolist() == [0.0, g**2 * 0.25, g * 0.25 + g**2 * 1.0, 0.25 + g, 1.0]
    assert d["next_obs"][:, 0].tolist() == [3, 4, 99, 99, 99] and d["next_action"][:2, 0].tolist() == [23, 24]
    assert d["done"].tolist() == [0, 0, 1, 1, 1] and d["discount"].tolist() == [g**3, g**3, g**3, g**2, g]
    assert (d["ready"] == 1).all() and not win


@pytest.mark.parametrize("n_step, want", [(1, 0.99), (3, 0.25)])
def test_the_td_target_bootstraps_with_the_rows_own_discount_at_n_step(n_step, want):
    agent = NoiseAgent(1, 1, 1, AgentConfig(**{**TINY.to_json(), "n_step": n_step, "gamma": 0.99}))
    with torch.no_grad():
        for q in agent.qa_target.q:
            q[-1].bias.fill_(1.0)  # the target critics value every next state at 1
    b = {k: torch.zeros(4, 1) for k in ("obs", "noise", "action", "next_obs", "next_action")}
    b.update(reward=torch.zeros(4), done=torch.zeros(4), ready=torch.ones(4), discount=torch.full((4,), 0.25))
    assert agent.critic_step(b)["target_mean"] == pytest.approx(want)


def test_configs_refuse_bad_values():
    with pytest.raises(ValueError, match="algorithm"):
        AgentConfig(algorithm="ppo")
    with pytest.raises(ValueError, match="hidden"):
        AgentConfig(hidden=0)
    with pytest.raises(ValueError, match="magnitude"):
        AgentConfig(magnitude=5.0)
    with pytest.raises(ValueError, match="task"):
        TrainConfig(task="nope")
    with pytest.raises(ValueError, match="num_envs"):
        TrainConfig(num_envs=0)
    with pytest.raises(ValueError, match="minutes"):
        TrainConfig(minutes=0)
    with pytest.raises(ValueError, match="noise_penalty"):
        AgentConfig(noise_penalty=-1.0)
    with pytest.raises(ValueError, match="training run seed"):
        held_out("pushblock", TRAIN_SEED_BASE + 3)
    with pytest.raises(ValueError, match="held-in"):
        held_out("pushblock", HELDIN_SEED_BASE + 7)
    with pytest.raises(ValueError, match="alpha_min"):
        AgentConfig(alpha_min=-0.1)
    with pytest.raises(ValueError, match="seed"):
        TrainConfig(seed=1000)  # its training run seeds would be held-in ones
    with pytest.raises(ValueError, match="heldin_episodes"):
        TrainConfig(heldin_episodes=0)
    with pytest.raises(ValueError, match="n_step"):
        AgentConfig(n_step=0)
    with pytest.raises(ValueError, match="view"):
        TrainConfig(view="state+velocity")  # peg-insert-side: MetaWorld's observation already holds the last frame
    with pytest.raises(ValueError, match="view"):
        TrainConfig(task="pushblock", view="pixels")
    with pytest.raises(ValueError, match="snapshot_minutes"):
        TrainConfig(minutes=15, snapshot_minutes=15)
    assert held_out("pushblock", 4).eval_seed == 4 and held_out("pushblock", None) == TASKS["pushblock"]


def _tiny_run(seed: int = 0, algorithm: str = "na", **kw):
    kw = {"heldin_every": 16, "heldin_episodes": 3, "heldin_envs": 2, **kw}
    cfg = TrainConfig(task="pushblock", seed=seed, minutes=5, max_transitions=48, num_envs=2, init_steps=16, critic_steps=1, distill_steps=1,
                      agent=AgentConfig(**{**TINY.to_json(), "algorithm": algorithm}), **kw)  # fmt: skip
    return train(cfg, progress=lambda line: None)


@pytest.mark.slow(seconds=40)
def test_a_seed_repeats_the_run_bit_for_bit_and_the_budget_adds_up():
    threads = torch.get_num_threads()
    a1, info1 = _tiny_run(0)
    assert torch.get_num_threads() == threads  # train() gives the caller's thread budget back
    a2, info2 = _tiny_run(0)
    a3, _ = _tiny_run(1)
    s1, s2, s3 = a1.state_dict(), a2.state_dict(), a3.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert not all(torch.equal(s1[k], s3[k]) for k in s1)

    def bits(points):  # all but the wall clock
        return [{k: v for k, v in p.items() if k != "minutes"} for p in points]

    assert bits(info1["held_in"]) == bits(info2["held_in"]) and bits([info1["kept"]]) == bits([info2["kept"]])
    b = info1["budget"]
    assert (
        b["transitions"] == 48 and b["vector_steps"] == 24 and b["env_steps"] == 48 * TASKS["pushblock"].execute_steps
    )
    assert b["critic_updates"] == b["distill_updates"] == b["actor_updates"] == 24 - 16 // 2 + 1
    # held-in checkpoints at 0, every 16 transitions and at the end; the kept one is the best (ties: the later)
    points = info1["held_in"]
    assert [p["transitions"] for p in points] == [0, 16, 32, 48] and b["held_in_checkpoints"] == 4
    best = max(p["success"] for p in points)
    assert info1["kept"] == [p for p in points if p["success"] == best][-1]
    assert all(p["episodes"] == 3 and p["zero_noise"] == points[0]["zero_noise"] for p in points)
    # the held-in stream and a snapshot do not touch training: without keep-best the weights are a run's without held-in
    a4, info4 = _tiny_run(0, keep_best=False, snapshot_minutes=1e-6)
    a5, info5 = _tiny_run(0, heldin_every=0)
    s4, s5 = a4.state_dict(), a5.state_dict()
    assert all(torch.equal(s4[k], s5[k]) for k in s4) and info5["held_in"] == [] and info5["kept"] is None
    assert bits([info4["kept"]]) == bits([{**points[-1], "kept": False}])


def test_branch_restarts_ended_episodes_at_kept_boundaries():
    """Branch data: while fewer starts are left than sub-envs, one running sub-env's boundary is kept for ``branches``
    starts; ended episodes restart there (oldest first; ``obs`` updated in place), exactly at that state."""
    from gymnasium.vector import AutoresetMode

    from rollcap.critics import CriticRunner, ValueCritic
    from rollcap.policies import FlowVLA, PolicyRunner
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.gym.vector import NoiseSteeringVectorEnv
    from tests.rollout._tiny import CRITIC, POLICY, make_env

    torch.manual_seed(0)
    runners = PolicyRunner(FlowVLA(POLICY).eval(), batch=3), CriticRunner(ValueCritic(CRITIC).eval(), batch=3)
    env = NoiseSteeringVectorEnv([make_env() for _ in range(3)], *runners, HostConfig(max_chunks=3),
                                 autoreset_mode=AutoresetMode.SAME_STEP)  # fmt: skip
    b = Branches(3, branches=2, fraction=1.0, gamma=0.5)
    rng = np.random.default_rng(0)
    try:
        obs, _ = env.reset(seed=4)
        for t in range(12):
            obs, _, term, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
            done = term | trunc
            for i in range(3):  # a made-up reward, on an episode's last chunk: one more in each sub-env
                r = float(done[i]) * (1 + i)
                b.record(i, np.full(4, float(b.group[i])), np.full(2, float(t)), r, bool(done[i]))
            before = [(at, left) for at, left, _ in b.kept]
            again = b.step(env, obs, done, rng)
            assert len(again) == min(
                int(done.sum()), sum(left for _, left in before)
            )  # every ended one, while starts last
            for i in again:  # restarted at the oldest boundaries: their observations, exactly
                assert any(np.array_equal(obs["state"][i], at.obs["state"]) for at, _ in before) and b.phase[i] == 1
            assert all(0 < left <= 2 for _, left, _ in b.kept)
        assert b.restarts >= 3 and b.groups
        for g, members in b.groups.items():  # a group: the first chunks of the episodes restarted at one boundary
            assert 1 <= len(members) <= 2 and all(o[0] == g for o, _, _ in members)
        pairs = b.pairs(rng, 8)  # the groups whose two episodes returned differently: one pair each, the better first
        assert pairs is not None and (pairs["hi_obs"] == pairs["lo_obs"]).all()
        assert len(pairs["hi_obs"]) == min(8, len(b.ranked)) and b.ranked
    finally:
        env.close()
    with pytest.raises(ValueError, match="branch_fraction"):
        TrainConfig(branches=2, branch_fraction=1.5)
    with pytest.raises(ValueError, match="rank_steps: needs branches"):
        TrainConfig(rank_steps=1)


@pytest.mark.slow(seconds=5)
def test_a_run_with_branch_data_repeats_bit_for_bit():
    runs = (
        _tiny_run(0, heldin_every=0, branches=2, branch_fraction=1.0, branch_greedy=True, rank_steps=1)
        for _ in range(2)
    )
    (a1, info1), (a2, info2) = runs
    assert info1["budget"]["restarts"] >= 2 and info1["budget"]["transitions"] == 48
    assert info1["budget"]["restarts"] == info2["budget"]["restarts"]
    s1, s2 = a1.state_dict(), a2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


@pytest.mark.slow(seconds=10)
def test_a_snapshot_is_what_a_shorter_run_would_have_kept_and_the_last_agent_comes_along():
    """--snapshot-minutes: a held-in checkpoint at that minute and the best agent so far, without touching the
    training (the bit-for-bit test runs one with a snapshot); when keep-best keeps an earlier agent than the last, the
    last one is returned beside it."""
    agent, info = _tiny_run(0, snapshot_minutes=1e-6)  # due after the first vector step
    snap, points = info["snapshot"], info["held_in"]
    assert [p["transitions"] for p in points] == [0, 2, 16, 32, 48] and snap["budget"]["transitions"] == 2
    assert snap["kept"] is [p for p in points[:2] if p["success"] == max(q["success"] for q in points[:2])][-1]
    fresh = NoiseAgent(agent.obs_dim, agent.noise_dim, agent.action_dim, agent.cfg, seed=0).state_dict()
    assert all(torch.equal(snap["state"][k], fresh[k]) for k in fresh)  # no update before init_steps
    if info["kept"] is points[-1]:
        assert info["last"] is None
    else:
        assert info["last"]["point"] is points[-1]
        assert not all(torch.equal(info["last"]["state"][k], v) for k, v in agent.state_dict().items())


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("view", ["state", "state+velocity"])
def test_a_zero_noise_actor_scores_as_the_zero_noise_baseline(view):
    """The held-out side runs the actor's deterministic noise through the same env as the baseline's zero noise; a
    view with the blocks' velocities changes what the agent sees, not what the policy does."""
    agent, _ = _tiny_run(0, view=view)
    assert agent.obs_dim == 28 + 6 + (9 if view == "state+velocity" else 0)
    with torch.no_grad():  # the squashed mean is tanh(0) = 0 everywhere
        agent.actor.net[-1].weight.zero_()
        agent.actor.net[-1].bias.zero_()
    base = baseline("pushblock", 3, progress=lambda line: None)
    result = evaluate(agent, "pushblock", 3, base, 0.99, view)
    assert result["steered"] == base["zero_noise"]
    assert result["noise"]["abs_mean"] == 0.0
    assert result["critic_vs_monte_carlo"]["chunks"] > 3


EXAMPLE = [sys.executable, str(ROOT / "examples" / "dsrl.py")]
SMALL = ["--task", "pushblock", "--max-transitions", "32", "--num-envs", "2", "--init-steps", "8", "--hidden", "32",
         "--log-every-s", "0", "--heldin-every", "16", "--heldin-episodes", "2", "--heldin-envs", "2"]  # fmt: skip


@pytest.mark.slow(seconds=40)
def test_the_push_frame_is_the_same_for_a_scene_moved_and_turned():
    """scripts/dsrl_rankable.py --frame block: a push seen from anywhere on the table, at any heading, is one input."""
    spec = importlib.util.spec_from_file_location("dsrl_rankable", ROOT / "scripts" / "dsrl_rankable.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    n, horizon = 5, 8
    state = rng.uniform(-0.2, 0.2, (n, 28))
    vel = rng.uniform(-0.5, 0.5, (n, 9))
    code = np.zeros((n, 6))
    code[np.arange(n), rng.integers(0, 3, n)] = 1
    code[np.arange(n), 3 + rng.integers(0, 3, n)] = 1
    chunk = rng.uniform(-1, 1, (n, 2 * horizon))

    def turned(a: float, shift) -> tuple[np.ndarray, np.ndarray]:  # every planar vector turned by a, positions moved
        r = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        s, v = state.copy(), vel.copy()
        s[:, 0:2] = s[:, 0:2] @ r.T + shift
        for sl in [
            slice(2, 4),
            *(slice(4 + 4 * j, 6 + 4 * j) for j in range(3)),
            *(slice(16 + 4 * j, 18 + 4 * j) for j in range(3)),
        ]:
            s[:, sl] = s[:, sl] @ r.T
        for j in range(3):
            s[:, 18 + 4 * j : 20 + 4 * j] = s[:, 18 + 4 * j : 20 + 4 * j] @ r.T + shift  # targets' own x, y
            v[:, 3 * j : 3 * j + 2] = v[:, 3 * j : 3 * j + 2] @ r.T
        c = (chunk.reshape(n, horizon, 2) @ r.T).reshape(n, -1)
        return np.concatenate([s, v, code], 1).astype(np.float32), c.astype(np.float32)

    f0, c0 = mod.block_frame(*turned(0.0, 0.0))
    f1, c1 = mod.block_frame(*turned(2.1, np.array([0.05, -0.03])))
    assert f0.shape == (n, 14) and c0.shape == (n, 2 * horizon)
    np.testing.assert_allclose(f1, f0, atol=1e-5)
    np.testing.assert_allclose(c1, c0, atol=1e-5)
    assert np.abs(c0 - chunk).max() > 0.1  # and it is a turn, not the identity
    with pytest.raises(ValueError, match="width 30"):
        mod.block_frame(np.zeros((1, 30), np.float32), np.zeros((1, 16), np.float32))


def test_example_writes_result_agent_and_curve(tmp_path):
    cmd = [*EXAMPLE, *SMALL, "--algorithm", "sac", "--eval-episodes", "2", "--snapshot-minutes", "1e-6",
           "--out", str(tmp_path / "run")]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "result.json").read_text())
    # the snapshot (right after the first vector step) is scored on the same held-out episodes
    assert report["snapshot"]["budget"]["transitions"] == 2 and report["snapshot"]["eval"]["episodes"] == 2
    assert (tmp_path / "run" / "agent-snapshot.safetensors").exists() and "-minute snapshot:" in res.stdout
    assert report["config"]["agent"]["algorithm"] == "sac" and report["budget"]["transitions"] == 32
    assert report["eval"]["episodes"] == 2 and len(report["eval"]["steered"]) == 2 and report["curve"]
    assert (tmp_path / "run" / "agent.safetensors").exists()
    assert (tmp_path / "baseline-pushblock-2-2.json").exists()
    # the three streams, the held-in curve (0, 16, 32 transitions), the kept checkpoint and the last line
    st = report["streams"]
    assert st["held_out"] == {**st["held_out"], "run_seed": 2, "episodes": 2}
    assert st["held_in"]["run_seeds"] == [HELDIN_SEED_BASE, HELDIN_SEED_BASE + 1]
    assert st["training"]["run_seeds"] == [TRAIN_SEED_BASE, TRAIN_SEED_BASE + 1]
    assert [p["transitions"] for p in report["held_in"]] == [0, 2, 16, 32] and report["kept"] in report["held_in"]
    k = report["kept"]
    last = res.stdout.strip().splitlines()[-1]
    n = k["episodes"]
    said = f"kept agent from minute {k['minutes']:.1f}: {k['success'] / n:.1%} held-in vs {k['zero_noise'] / n:.1%} zero noise"
    assert last.startswith(said), res.stdout[-2000:]
    assert sum(line.startswith("held-in ") for line in res.stdout.splitlines()) == 4
    # every output has the same mode (agent.safetensors was 0600)
    umask = os.umask(0)
    os.umask(umask)
    for name in ("result.json", "agent.safetensors", "agent-snapshot.safetensors", "curve.png"):
        if name != "curve.png" or (tmp_path / "run" / name).exists():
            assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    # the probe reads the run's agent and ranks its chunks at one state
    probe = subprocess.run([sys.executable, str(ROOT / "scripts" / "dsrl_probe.py"), "--states", "1", "--branches", "2", "--prefix", "1",
                            "--run", str(tmp_path / "run"), "--out", str(tmp_path / "probe.json"), "--dump", str(tmp_path / "probe.npz")],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    rows = json.loads((tmp_path / "probe.json").read_text())["rows"]
    assert len(rows) == 1 and all(len(r["qw"]) == len(r["success"]) == 2 and r["block_speed"] >= 0 for r in rows)
    with np.load(tmp_path / "probe.npz") as dump:  # the branches themselves, for scripts/dsrl_rankable.py
        assert (
            dump["chunk"].shape[:2] == dump["success"].shape == (1, 2)
            and (dump["features"][0] == dump["features"][0, 0]).all()
        )
    npz = str(tmp_path / "probe.npz")
    ranked = subprocess.run([sys.executable, str(ROOT / "scripts" / "dsrl_rankable.py"), npz, npz, "--epochs", "1", "--hidden", "8"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ranked.returncode == 0 and json.loads(ranked.stdout)["test_states"] == 1, ranked.stderr[-2000:]
    framed = subprocess.run([sys.executable, str(ROOT / "scripts" / "dsrl_rankable.py"), npz, npz, "--epochs", "1", "--hidden", "8",
                             "--frame", "block", "--train-states", "1", "--only", "pairwise"], capture_output=True, text=True, timeout=120)  # fmt: skip
    got = json.loads(framed.stdout)
    assert framed.returncode == 0 and got["frame"] == "block" and "chunk/bce/test" not in got, framed.stderr[-2000:]
    assert got["chunk/pairwise/picked"]["zero_noise"] in (0.0, 1.0)  # branch 0 is the zero-noise one
    too_many = subprocess.run([sys.executable, str(ROOT / "scripts" / "dsrl_rankable.py"), npz, npz, "--train-states", "2"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (
        too_many.returncode == 2
        and "--train-states: expected 1..1" in too_many.stderr
        and "Traceback" not in too_many.stderr
    )
    # the table script lists the kept agent and the snapshot, with their held-out figures
    table = subprocess.run([sys.executable, str(ROOT / "scripts" / "dsrl_table.py"), str(tmp_path / "run")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert table.returncode == 0 and "| run | kept |" in table.stdout and "kept at minute 1e-06" in table.stdout
    # a rerun into the same --out is refused before it trains, the result untouched
    before = (tmp_path / "run" / "result.json").read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--overwrite" in again.stderr and "Traceback" not in again.stderr, again.stderr
    assert (tmp_path / "run" / "result.json").read_bytes() == before and "transitions" not in again.stdout


@pytest.mark.parametrize(
    "flags, word",
    [
        (["--algorithm", "ppo"], "--algorithm"),
        (["--eval-seed", "500001"], "training run seed"),
        (["--eval-seed", str(HELDIN_SEED_BASE + 5)], "held-in"),
        (["--eval-episodes", "0"], "--eval-episodes"),
        (["--eval-episodes", "-3"], "--eval-episodes"),
        (["--out", "/proc/x"], "--out"),
        (["--minutes", "nan"], "--minutes"),
        (["--success-reward", "nan"], "--success-reward"),
        (["--heldin-episodes", "0"], "--heldin-episodes"),
        (["--alpha-min", "-1"], "--alpha-min"),
        (["--seed", "1000"], "--seed"),
        (["--snapshot-minutes", "15"], "--snapshot-minutes"),
        (["--view", "state+velocity"], "--view"),
        (["--n-step", "0"], "--n-step"),
    ],
)
def test_example_checks_every_flag_before_training(tmp_path, flags, word):
    """One line naming the flag, exit 2, nothing created, no training (on the old example --eval-episodes 0 trained
    its whole budget, then died in the evaluation; --out /proc/x did the same with a traceback)."""
    out = [] if "--out" in flags else ["--out", str(tmp_path / "bad")]
    bad = subprocess.run([*EXAMPLE, *flags, *out], capture_output=True, text=True, timeout=60)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and word in lines[0] and "Traceback" not in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists() and not bad.stdout


@pytest.mark.slow(seconds=90)
def test_example_keeps_the_training_when_the_evaluation_dies(tmp_path):
    """The agent and result.json (its training) are written before the held-out evaluation: killed during it, the
    run keeps both (the old example wrote neither until the evaluation had finished)."""
    out = tmp_path / "run"
    cmd = [*EXAMPLE, *SMALL, "--eval-episodes", "40", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "agent.safetensors").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before its agent was written: " + proc.stderr.read()[-2000:]
        time.sleep(0.5)  # inside the evaluation (40 steered + 80 baseline episodes at batch 1)
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    report = json.loads((out / "result.json").read_text())
    assert report["eval"] is None and report["budget"]["transitions"] == 32 and report["kept"] in report["held_in"]
    weights = load_file(str(out / "agent.safetensors"))
    assert "log_alpha" in weights and not (tmp_path / "baseline-pushblock-2-40.json").exists()


def test_vector_env_over_a_metaworld_task_and_the_agents_view_of_it():
    """The peg-insert-side setting: the MT10 policy at batch 2 on a MetaWorld vector env (no images); the agent sees
    MetaWorld's 39 numbers and the MT10 one-hot. ``env_kwargs`` beside ``parts`` is refused."""
    pytest.importorskip("metaworld")
    from rollcap.rollout.errors import ConfigError
    from rollcap.rollout.gym.vector import make_noise_steering_vector_env
    from rollcap.rollout.learn.dsrl_eval import _task_code, features

    task = TASKS["peg-insert-side"]
    with pytest.raises(ConfigError, match="env_kwargs"):
        make_noise_steering_vector_env(2, env_kwargs={"render_images": False}, parts=task.parts())
    env = make_noise_steering_vector_env(2, config={"execute_steps": task.execute_steps}, parts=task.parts())
    try:
        obs, _ = env.reset(seed=[7, 8])
        f = features(obs, _task_code(task))
        assert f.shape == (2, 39 + 10) and "image_front" not in obs
        assert f[:, 39:].sum(1).tolist() == [1.0, 1.0]
        obs, reward, term, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
        assert info["policy_chunk"].shape == (2, 8, 4) and info["steps"].tolist() == [4, 4]
    finally:
        env.close()
