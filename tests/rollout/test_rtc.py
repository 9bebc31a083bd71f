"""Real-time chunking through the host: the schedule, config errors, exact replay in a fresh process, and the
capsule restore that makes reset correct once the policy carries state across chunks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import rollcap.rollout.host as host_mod
from rollcap.policies import FlowVLA
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.recording.codec import episode_digest
from rollcap.rollout.rtc import ControlClock
from tests.rollout._tiny import POLICY, make_env

ROOT = Path(__file__).resolve().parents[2]
RTC = {"chunking": "rtc", "inference_delay": 1, "execute_steps": 2}
# A fresh process: the same tiny policy (seeded weights), a new host, episode 1 only; prints its digest.
FRESH = """
import torch
from rollcap.policies import FlowVLA
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.recording.codec import episode_digest
from tests.rollout._tiny import POLICY, make_env
torch.manual_seed(0)
host = RolloutHost(make_env(), RTCPolicyRunner(FlowVLA(POLICY).eval()), None, HostConfig(seed=4, **%r))
print(episode_digest(host.run_episode(1).record))
"""


@pytest.fixture(scope="module")
def rtc_policy():
    torch.manual_seed(0)
    p = RTCPolicyRunner(FlowVLA(POLICY).eval())
    yield p
    p.close()


def test_the_schedule_executes_the_carried_queue_then_the_new_chunk(runners, rtc_policy):
    """Chunk k starts at step k*s; its first d steps are chunk k-1's actions s..s+d-1, then its own d..s-1."""
    h, s, d = POLICY.horizon, 2, 1
    rec = RolloutHost(make_env(), rtc_policy, None, HostConfig(seed=1, **RTC), predicates=[]).run_episode(0).record
    starts, chunks, acts = rec.chunks["chunk_start"], rec.chunks["policy_chunk"], rec.steps["actions"]
    assert starts.tolist() == list(range(0, s * len(starts), s))
    assert np.array_equal(acts[0:s], chunks[0][0:s])
    for k in range(1, len(starts) - 1):
        t = starts[k]
        assert np.array_equal(acts[t : t + d], chunks[k - 1][s : s + d]), f"chunk {k}: queue"
        assert np.array_equal(acts[t + d : t + s], chunks[k][d:s]), f"chunk {k}: own actions"
        assert np.array_equal(rec.chunks["rtc_carried"][k][: h - s], chunks[k - 1][s:])
    assert not rec.chunks["rtc_weights"][0].any() and rec.chunks["rtc_weights"][1][0] == 1.0
    assert np.array_equal(rec.policy_actions(), acts)  # every step's action was the policy's, queue steps included


def test_naive_with_no_delay_is_the_synchronous_episode(runners, rtc_policy):
    """d = 0 without guidance executes exactly what synchronous chunking does (the same steps, bit for bit)."""
    plain, _ = runners
    torch.manual_seed(0)
    env = make_env()
    sync = (
        RolloutHost(env, plain.__class__(rtc_policy.model), None, HostConfig(seed=2, execute_steps=2))
        .run_episode(0)
        .record
    )
    naive = (
        RolloutHost(env, rtc_policy, None, HostConfig(seed=2, execute_steps=2, chunking="naive")).run_episode(0).record
    )
    as_sync = (
        RolloutHost(env, rtc_policy, None, HostConfig(seed=2, execute_steps=2)).run_episode(0).record
    )  # after an RTC schedule
    for k in sync.steps:
        assert sync.steps[k].tobytes() == naive.steps[k].tobytes() == as_sync.steps[k].tobytes(), k
    assert "rtc_carried" not in sync.chunks and "rtc_carried" in naive.chunks


def test_synchronous_chunking_replays_the_policy_on_the_host_s_thread_and_rtc_on_its_lane(rtc_policy):
    """sync: the replay runs inside result() on the host's thread (one hand-off fewer); rtc: on the lane, while the carried queue executes."""
    seen: list[int] = []
    replay = rtc_policy.graph.replay
    rtc_policy.graph.replay = lambda: (seen.append(threading.get_ident()), replay())[
        1
    ]  # launch() looks it up each time
    try:
        for cfg, on_host in (({"execute_steps": 2}, True), (RTC, False), ({"execute_steps": 2}, True)):
            seen.clear()
            RolloutHost(make_env(), rtc_policy, None, HostConfig(seed=1, max_chunks=3, **cfg)).run_episode(0)
            assert rtc_policy.in_caller is on_host
            assert seen and {t == threading.get_ident() for t in seen} == {on_host}, cfg
    finally:
        del rtc_policy.graph.replay


def test_bad_real_time_configs_are_refused_by_field(runners, rtc_policy):
    """A plain policy, a delay that does not fit, a delay with sync: one ConfigError each, naming the field."""
    plain, _ = runners
    with pytest.raises(ConfigError, match="chunking"):
        RolloutHost(make_env(), plain, None, HostConfig(**RTC))
    with pytest.raises(ConfigError, match="inference_delay"):
        RolloutHost(make_env(), rtc_policy, None, HostConfig(chunking="rtc", inference_delay=3, execute_steps=2))
    with pytest.raises(ConfigError, match="inference_delay"):
        HostConfig(inference_delay=1)
    with pytest.raises(ConfigError, match="control_period_s"):
        HostConfig(control_period_s=-1.0)
    from rollcap.rollout.gym.envs import ChunkEnv

    with pytest.raises(ConfigError, match="chunking"):  # its step() would miss the queue's steps
        ChunkEnv(make_env(), rtc_policy, None, HostConfig(**RTC))


@pytest.mark.slow
def test_skipping_the_capsule_restore_leaks_the_carried_prefix(rtc_policy, monkeypatch):
    """With the restore, episode 1 after episode 0 is byte-identical to episode 1 in a fresh process; without it, it diverges."""
    fresh = subprocess.run([sys.executable, "-c", FRESH % RTC], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    want = fresh.stdout.split()[-1]
    env = make_env()
    host = RolloutHost(env, rtc_policy, None, HostConfig(seed=4, **RTC))
    assert [episode_digest(e.record) for e in host.run(2)][1] == want
    monkeypatch.setattr(host_mod, "restore", lambda capsule, components: None)  # the audit's stub
    host = RolloutHost(env, rtc_policy, None, HostConfig(seed=4, **RTC))
    leaked = host.run(2)[1].record
    assert episode_digest(leaked) != want
    assert leaked.chunks["rtc_weights"][0].any()  # the first chunk was guided by the previous episode's plan


@pytest.mark.slow
def test_rtc_episodes_replay_exactly_in_all_three_modes_in_a_fresh_process(ckpt, tmp_path):
    """rollcap run --chunking rtc records; rollcap replay in another process proves policy, env and closed exact."""
    out = tmp_path / "run"
    flags = ["--chunking", "rtc", "--inference-delay", "1", "--execute-steps", "2", "--max-chunks", "12"]
    run = subprocess.run(
        ["rollcap", "run", "--episodes", "2", "--seed", "3", "--out", str(out), *flags, *ckpt],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    policy_flags = ckpt[: ckpt.index("--env-kwargs")]
    for target in (out / "episodes", out / "episodes.hdf5"):  # npz and HDF5
        files = sorted(map(str, target.glob("*.npz"))) if target.is_dir() else [str(target)]
        rep = subprocess.run(["rollcap", "replay", *files, *policy_flags], capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
        assert "2 episode(s), 3 mode(s): 6 exact" in rep.stdout, rep.stdout


def test_a_host_on_a_control_clock_steps_at_its_period(rtc_policy):
    """With control_period_s every env step waits for its tick; the recorded episode is the unpaced one."""
    import time

    cfg = dict(seed=5, max_chunks=3, **RTC)
    env = make_env()
    plain = RolloutHost(env, rtc_policy, None, HostConfig(**cfg)).run_episode(0).record
    host = RolloutHost(env, rtc_policy, None, HostConfig(control_period_s=0.01, **cfg))
    t0 = time.perf_counter()
    paced = host.run_episode(0).record
    assert time.perf_counter() - t0 >= 0.01 * (paced.num_steps - 1)
    assert paced.steps["actions"].tobytes() == plain.steps["actions"].tobytes() and host.clock.late_s >= 0.0


def test_control_clock_paces_steps_and_counts_lateness():
    """Steps wait for their tick; a step after a long pause is late by the pause minus one period, and the clock does not catch up."""
    import time

    clock = ControlClock(0.01)
    t0 = time.perf_counter()  # (before the tick a period is counted from: a busy machine may pause after it returns)
    clock.tick()
    clock.tick()
    assert time.perf_counter() - t0 >= 0.01 and clock.last_late_s == 0.0
    time.sleep(0.05)
    t1 = time.perf_counter()
    assert 0.03 < clock.tick() < 0.2
    clock.tick()
    assert time.perf_counter() - t1 >= 0.01 and clock.last_late_s == 0.0
    with pytest.raises(ValueError):
        ControlClock(0)


@pytest.mark.slow
def test_bench_rtc_smoke(tmp_path):
    """The RTC benchmark's sections run end to end with a tiny budget and write their JSON."""
    from rollcap.rollout.bench.rtc import main, paired_diff
    from rollcap.rollout.stats import wilson

    out = tmp_path / "rtc.json"
    assert (
        main(
            [
                "--episodes",
                "1",
                "--stall-episodes",
                "1",
                "--delays",
                "2",
                "--modes",
                "rtc-soft",
                "--period-ms",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert (
        set(res["stall"]) == {"sync/d0", "rtc/d2"}
        and set(res["success"]) == {"sync/d0", "rtc-soft/d2"}
        and res["graph"]["ratio"] > 0
    )
    assert res["success"]["rtc-soft/d2"]["episodes"] == 1 and "minus_sync" in res["success"]["rtc-soft/d2"]
    _, lo, hi = wilson(172, 200)
    assert 0.80 < lo < 0.86 < hi < 0.91 and paired_diff(np.array([1, 1, 0]), np.array([1, 1, 0]))[0] == 0.0
