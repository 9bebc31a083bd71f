"""Branching rollouts: the control reproduces the parent, branches differ and replay alone, MC values, calibration."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rollcap.rollout.offline.branch import boundaries, continuation_diff, mc_value, run_branches
from rollcap.rollout.offline.calibrate import calibrate, calibration_stats
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.recording import EpisodeRecorder, read_h5_episode, read_npz, records_equal
from rollcap.rollout.offline.replay import replay_closed, replay_env
from rollcap.rollout.resume import resume_of
from tests.rollout._tiny import make_env

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def rollcap(*args, timeout=300):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def parent(runners, tmp_path_factory):
    """A recorded parent episode (both formats) that ends by the critic predicate after a few chunks."""
    p, c = runners
    out = tmp_path_factory.mktemp("parent")
    host = RolloutHost(make_env(), p, c, HostConfig(seed=5, max_chunks=9, critic_threshold=-0.2, critic_patience=4))
    rec = host.run_episode(0).record
    rec_dir = EpisodeRecorder(out)
    rec_dir.write(rec)
    rec_dir.close()
    return out, rec


def _host(rec, runners):
    p, c = runners
    return RolloutHost(make_env(), p, c, HostConfig.from_json(rec.config))


@pytest.mark.parametrize("fmt", ["npz", "h5"])
def test_control_branch_reproduces_the_parent_continuation_byte_for_byte(parent, runners, tmp_path, fmt):
    """From a file of either format, the control branch equals the parent from chunk K on, stop by the warmed-up critic predicate included."""
    out, rec = parent
    assert rec.stop_reason == "critic" and rec.num_chunks == 4  # patience 4: the predicate's counter matters
    loaded = (
        read_npz(out / "episodes" / "episode_00000.npz") if fmt == "npz" else read_h5_episode(out / "episodes.hdf5", 0)
    )
    host = _host(loaded, runners)
    for k in (0, 2, 3):
        rec_out = EpisodeRecorder(tmp_path / f"b{k}", (fmt,))
        res = run_branches(host, loaded, k, 2, parent=str(out), recorder=rec_out)
        rec_out.close()
        assert res.control_diff is None and res.fingerprint_diff == [], (k, res.control_diff)
        control = res.control
        assert control.origin == {**control.origin, "episode": 0, "chunk": k, "branch": 0, "noise": "parent"}
        assert control.stop_reason == "critic" and control.num_chunks == 4 - k
        back = (
            read_npz(tmp_path / f"b{k}" / "episodes" / "episode_00000.npz")
            if fmt == "npz"
            else read_h5_episode(tmp_path / f"b{k}" / "episodes.hdf5", 0)
        )
        assert records_equal(back, control) is None


def test_a_diverging_control_is_reported(parent, runners):
    """The check is not vacuous: a control compared at the wrong chunk is named as different."""
    _, rec = parent
    res = run_branches(_host(rec, runners), rec, 1, 0)
    assert res.control_diff is None
    assert continuation_diff(rec, 0, res.control) is not None


def test_seeded_branches_differ_and_each_replays_alone(parent, runners):
    """Branches with different seeds differ; each replays exactly from its own record (env and closed loop)."""
    _, rec = parent
    host = _host(rec, runners)
    res = run_branches(host, rec, 1, 3)
    seeded = res.records[1:]
    assert len({r.seed for r in seeded}) == 3
    noises = [r.chunks["noise"][0].tobytes() for r in res.records]
    assert len(set(noises)) == 4  # the control's and three fresh ones
    acts = [r.steps["actions"][:4].tobytes() for r in seeded]
    assert len(set(acts)) == 3
    env = make_env()
    for r in res.records:
        assert resume_of(r) is not None
        assert replay_env(r, env).exact
        closed = replay_closed(r, _host(r, runners))
        assert closed.exact, closed.line()


def test_branching_rejects_bad_boundaries(parent, runners):
    """A chunk outside the episode is a ConfigError naming the chunk; nothing runs."""
    _, rec = parent
    host = _host(rec, runners)
    with pytest.raises(ConfigError, match="chunks 0..3"):
        boundaries(rec, host.env, [4])
    with pytest.raises(ConfigError, match="n=0"):
        run_branches(host, rec, 0, 0, control=False)


def test_mc_value_intervals(parent, runners):
    """The MC value's mean is the critic target's mean; success is a Wilson interval inside [0, 1]."""
    _, rec = parent
    res = run_branches(_host(rec, runners), rec, 0, 3, control=False)
    mc = mc_value(rec, 0, res.records, 200)
    assert mc.n == 3 and mc.value[1] <= mc.value[0] <= mc.value[2]
    assert 0.0 <= mc.success[1] <= mc.success[0] <= mc.success[2] <= 1.0
    assert mc.critic == pytest.approx(float(rec.chunks["critic_value"][0]))


def test_calibration_stats_and_report(parent, runners, tmp_path):
    """Perfectly matched values correlate 1 with zero error; a report over a run writes its JSON and plot."""
    s = calibration_stats(np.array([-1.0, -0.5, -0.2]), np.array([-1.0, -0.5, -0.2]))
    assert s["pearson"] == pytest.approx(1.0) and s["spearman"] == pytest.approx(1.0) and s["mae"] == 0.0
    assert calibration_stats(np.array([-0.1, -0.5, -0.9]), np.array([-1.0, -0.5, -0.2]))["pearson"] < -0.9
    out, rec = parent
    pytest.importorskip("matplotlib")
    report = calibrate([(str(out), rec)], lambda r: _host(r, runners), 2, 2, tmp_path / "cal")
    assert report["stats"]["boundaries"] == 2 and len(report["points"]) == 2
    assert json.loads((tmp_path / "cal" / "calibration.json").read_text())["stats"]["boundaries"] == 2
    assert (tmp_path / "cal" / "calibration.png").stat().st_size > 1000


@pytest.mark.slow(seconds=30)
def test_cli_branch_then_replay_in_a_fresh_process(ckpt, tmp_path):
    """rollcap run -> rollcap branch (control exact) -> rollcap replay of the branches: all exact, in fresh processes."""
    run = tmp_path / "run"
    res = rollcap("run", "--episodes", 1, "--out", run, "--max-chunks", 6, "--no-progress", *ckpt)
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path / "br"
    res = rollcap("branch", run / "episodes.hdf5", "--episode", 0, "--chunk", 2, "--n", 2, "--out", out, *ckpt[:4])
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "control: exact" in res.stdout and "MC value" in res.stdout
    summary = json.loads((out / "branch.json").read_text())
    assert summary["control"] == "exact" and len(summary["branches"]) == 3
    res = rollcap("replay", out, *ckpt[:4])
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "3 episode(s), 3 mode(s): 9 exact" in res.stdout
    res = rollcap("inspect", out, "--plot", tmp_path / "plots")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "plots" / "branches_00000_chunk002.png").stat().st_size > 1000  # the fan
    bad = rollcap("branch", run / "episodes.hdf5", "--chunk", 99, "--out", tmp_path / "x", *ckpt[:4])
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (
        bad.stderr
    )
    assert "--chunk" in bad.stderr and not (tmp_path / "x").exists()


def test_branch_actor_without_ray_matches_the_local_branch(ckpt):
    """BranchActor (the Ray actor's class, used plainly) runs a branch identical to the in-process one."""
    from pathlib import Path

    from rollcap.rollout.offline.branch import branch_resume
    from rollcap.rollout.ray.branch import BranchActor
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.recording import episode_digest

    config = HostConfig(seed=4, max_chunks=5)
    actor = BranchActor(Parts(env_kwargs=json.loads(ckpt[5]), policy=Path(ckpt[1]), critic=Path(ckpt[3])), config)
    try:
        rec = actor.run(0, 123, config)
        at = boundaries(rec, actor.env, [2])[2]
        seed, resume = branch_resume(at, rec, 1)
        remote = actor.branch(1, seed, config, resume)
        local = run_branches(actor.host(config), rec, 2, 1, at=at)
        assert local.control_diff is None
        assert episode_digest(remote) == episode_digest(local.records[1])
    finally:
        actor.close()


def test_a_branch_of_a_branch_counts_from_the_root(parent, runners):
    """The control of a control reproduces it, stopping by the critic predicate at the root's chunk count."""
    _, rec = parent
    host = _host(rec, runners)
    first = run_branches(host, rec, 1, 0).control
    assert first.stop_reason == "critic" and first.num_chunks == 3
    second = run_branches(host, first, 1, 1)
    assert second.control_diff is None, second.control_diff
    assert second.control.origin["offset"] == [1, int(rec.chunks["chunk_start"][1])] and second.control.num_chunks == 2
    res = replay_closed(second.records[1], _host(rec, runners))
    assert res.exact, res.line()


def test_one_branch_has_no_interval_and_strict_json(parent, runners):
    """The control alone (``--n 0``): a mean with no interval, null bounds in the JSON (not Infinity, which strict
    readers refuse), and a line that says so."""
    import json

    from rollcap.kernels.files import canonical_json

    _, rec = parent
    res = run_branches(_host(rec, runners), rec, 0, 0, control=True)
    mc = mc_value(rec, 0, res.records, 200)
    assert mc.n == 1 and mc.value[1:] == (None, None) and mc.ret[1:] == (None, None)
    json.loads(canonical_json(mc.to_json()), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert mc.line().endswith("over 1 branch (no interval for the mean of one)") and "inf" not in mc.line()
