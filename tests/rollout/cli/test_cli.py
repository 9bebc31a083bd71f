"""The rollcap CLI end to end, in subprocesses: run -> replay, SIGINT, corrupt files, bad flags."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from rollcap.critics import save_critic
from rollcap.policies import save_policy
from rollcap.rollout.recording import load_any
from tests.rollout._tiny import make_runners

pytestmark = (
    pytest.mark.slow
)  # subprocesses, Ray or trained examples: the fast tier (-m "not slow") leaves them to the full suite

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def rollcap(*args, timeout=240, cwd=None):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def run_dir(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    res = rollcap("run", "--episodes", 3, "--out", out, "--max-chunks", 4, "--no-progress", *ckpt)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "success rate" in res.stdout and "stop reasons" in res.stdout and "chunk boundary" in res.stdout
    return out


def test_run_records_both_formats(run_dir):
    """A run leaves 3 npz episodes, an HDF5 with 3 demos and a summary.json."""
    assert len(list((run_dir / "episodes").glob("episode_*.npz"))) == 3
    assert [r.index for r in load_any(run_dir / "episodes.hdf5")] == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == 3 and summary["stop_reasons"]


def test_replay_in_a_fresh_process_is_exact_in_all_modes(run_dir, ckpt):
    """replay reports every episode exact in policy, env and closed-loop modes (h5 and npz)."""
    for target in (run_dir / "episodes.hdf5", run_dir / "episodes"):
        res = rollcap("replay", target, *ckpt)
        assert res.returncode == 0, res.stdout + res.stderr[-2000:]
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("episode")]
        assert len(lines) == 9 and all(ln.rstrip().endswith("exact") for ln in lines), res.stdout


def test_replay_with_other_weights_reports_fingerprint_and_deviation(run_dir, tmp_path):
    """Replaying with different weights says exactness is not expected and reports the deviation."""
    p, c = make_runners(seed=2, backend="eager")
    save_policy(p.model, tmp_path / "p2")
    save_critic(c.model, tmp_path / "c2")
    args = [
        "replay",
        run_dir / "episodes" / "episode_00000.npz",
        "--mode",
        "policy",
        "--policy",
        tmp_path / "p2.json",
        "--critic",
        tmp_path / "c2.json",
    ]
    res = rollcap(*args)
    assert res.returncode == 1, res.stderr  # not proven exact: never a pass by default
    assert "fingerprint differs: weights_digest" in res.stdout and "max|diff|" in res.stdout
    assert "0 exact, 0 diverged, 1 not comparable, 0 failed" in res.stdout and "all exact" not in res.stdout
    res = rollcap(*args, "--accept-not-comparable")
    assert res.returncode == 0, res.stdout + res.stderr


def test_inspect_table_and_plots(run_dir, tmp_path):
    """inspect prints one row per episode and writes a PNG per episode."""
    res = rollcap("inspect", run_dir, "--plot", tmp_path / "plots")
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "plots").glob("*.png"))) == 3


@pytest.mark.parametrize("command", ["replay", "inspect"])
def test_corrupt_recordings_give_one_line_and_exit_2(run_dir, tmp_path, command):
    """A truncated npz or a non-HDF5 .hdf5 gets one line naming the file, exit 2, no traceback."""
    bad = tmp_path / "cut.npz"
    data = (run_dir / "episodes" / "episode_00000.npz").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    junk = tmp_path / "junk.hdf5"
    junk.write_text("not an hdf5 file")
    for path in (bad, junk):
        res = rollcap(command, path)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and path.name in res.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--episodes", "0"], "--episodes"),
        (["run", "--format", "csv"], "--format"),
        (["run", "--critic-threshold", "0.5"], "--critic-threshold"),
        (["run", "--env-kwargs", "{bad"], "--env-kwargs"),
        (["run", "--policy", "/nonexistent/p.json"], "/nonexistent/p.json"),
        (["replay", "/nonexistent.npz"], "/nonexistent.npz"),
        (["capsule", "inspect", "/nonexistent-capsule"], "/nonexistent-capsule"),
    ],
)
def test_user_mistakes_are_one_line_exit_2(args, needle, tmp_path):
    """Bad flags and missing files: exit 2, one line on stderr naming the culprit."""
    res = rollcap(*args, "--out", tmp_path / "o") if args[0] == "run" else rollcap(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_sigint_keeps_whole_episodes_and_exits_130(ckpt, tmp_path):
    """SIGINT mid-run: exit 130, every finished episode readable in both formats, none partial."""
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [*ROLLCAP, "run", "--episodes", "500", "--out", str(out), "--no-progress", *ckpt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "episodes").glob("episode_*.npz"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    npz = load_any(out / "episodes")
    h5 = load_any(out / "episodes.hdf5")
    assert len(npz) >= 2 and [r.index for r in npz] == list(range(len(npz)))
    assert [r.index for r in h5] == [r.index for r in npz]
    assert not [p for p in (out / "episodes").iterdir() if not p.name.endswith(".npz")]
    res = rollcap(
        "run", "--episodes", len(npz) + 1, "--out", out, "--resume", "--no-progress", *ckpt
    )  # --episodes is the run's total
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r.index for r in load_any(out / "episodes.hdf5")] == list(range(len(npz) + 1))


def test_help_everywhere():
    """--help works for the CLI and each subcommand, with an example."""
    for sub in ([], ["run"], ["replay"], ["inspect"], ["bench"], ["capsule", "inspect"]):
        res = rollcap(*sub, "--help")
        assert res.returncode == 0 and "usage:" in res.stdout
        assert sub == ["capsule", "inspect"] or "example" in res.stdout


def test_episodes_stopped_at_chunk_0_replay_exactly(ckpt, tmp_path):
    """A critic stop at the first boundary records that boundary's observation; every mode replays it exactly."""
    out = tmp_path / "r0"
    res = rollcap(
        "run", "--episodes", 2, "--out", out, "--critic-threshold", 0, "--critic-patience", 1, "--no-progress", *ckpt
    )
    assert res.returncode == 0, res.stderr[-2000:]
    recs = load_any(out)
    assert [r.num_steps for r in recs] == [0, 0] and all(r.stop_reason == "critic" for r in recs)
    assert all(set(r.final_obs) == {"image_front", "state"} for r in recs)
    res = rollcap("replay", out, *ckpt)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "2 episode(s), 3 mode(s): 6 exact, 0 diverged, 0 not comparable, 0 failed -- all exact" in res.stdout


def test_one_damaged_episode_is_reported_and_the_rest_checked(run_dir, ckpt, tmp_path):
    """A run directory with one truncated npz: that episode FAILED, the others exact, exit 1."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    victim = copy / "episodes" / "episode_00001.npz"
    victim.write_bytes(victim.read_bytes()[:500])
    res = rollcap("replay", copy, "--mode", "policy", *ckpt)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAILED" in res.stdout and "episode_00001.npz" in res.stdout
    assert "2 exact, 0 diverged, 0 not comparable, 1 failed" in res.stdout


def test_replay_refuses_a_different_env_override(run_dir, ckpt):
    """--env / --env-kwargs that differ from the recording's are refused in one line, not silently ignored."""
    for flag, value in (("--env", "HalfCheetah-v5"), ("--env-kwargs", '{"max_steps": 5}')):
        res = rollcap("replay", run_dir / "episodes" / "episode_00000.npz", "--mode", "env", flag, value, *ckpt[:4])
        assert res.returncode == 2, res.stdout + res.stderr
        assert flag in res.stderr and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--env", "HalfCheetah-v5"], "--policy: HalfCheetah-v5 observations are a Box space"),
        (["--env-kwargs", '{"image_size": 48}'], "--env-kwargs: rollcap/PushBlock-v0 does not fit the policy"),
        (["--env", "nosuchmodule:Foo-v0"], "--env"),
        (
            ["--env-kwargs", '{"image_size": 100000}'],
            "--env-kwargs: rollcap/PushBlock-v0: image_size must be an int in 8..1024",
        ),
        (["--device", "tpu"], "--device"),
        (["--device", "cuda:99"], "--device"),
        (["--max-seconds", "nan"], "--max-seconds"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_runs_that_cannot_work_are_refused_before_anything_is_created(args, needle, tmp_path):
    """An env the models cannot read, a bad device or a bad limit: one line naming the flag, exit 2, no run directory."""
    res = rollcap("run", "--out", tmp_path / "o", "--no-progress", *args, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    # MuJoCo warns about gymnasium 1.4's HalfCheetah model (settotalmass): one warning line naming the env, once,
    # not MuJoCo's own print and its MUJOCO_LOG.TXT in the working directory; then rollcap's error, one line
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    warned = [ln for ln in lines if ln.startswith("rollcap: warning: HalfCheetah-v5: MuJoCo: compiler attribute")]
    assert len(warned) == (1 if "HalfCheetah-v5" in args else 0), res.stderr
    ours = [ln for ln in lines if ln not in warned]
    assert len(ours) == 1 and needle in ours[0] and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run directory, no MUJOCO_LOG.TXT


def _start_run(out, ckpt, episodes=500):
    return subprocess.Popen(
        [*ROLLCAP, "run", "--episodes", str(episodes), "--out", str(out), "--no-progress", *ckpt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_episodes(out, n, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and len(list((out / "episodes").glob("episode_*.npz"))) < n:
        time.sleep(0.02)


def _assert_consistent(out):
    """npz and HDF5 hold the same whole episodes, no journal or temp file is left."""
    npz = [r.index for r in load_any(out / "episodes")]
    h5 = [r.index for r in load_any(out / "episodes.hdf5")]
    assert npz == h5 == list(range(len(npz)))
    leftovers = [p.name for p in out.rglob("*") if p.name.endswith(("-journal", ".tmp"))]
    assert not leftovers, leftovers
    return len(npz)


def test_ctrl_c_during_startup_exits_130_quietly(ckpt, tmp_path):
    """SIGINT while importing or capturing: exit 130, one line, no traceback."""
    proc = _start_run(tmp_path / "r", ckpt)
    time.sleep(1.5)  # past the interpreter's own start-up (~0.1 s), inside torch's import or the capture (~3 s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_double_signal_finishes_in_bounded_time_and_tells_the_truth(ckpt, tmp_path, sig, code):
    """Two signals in quick succession mid-run: bounded exit, no journal, both formats agree, the message's count is what is on disk."""
    out = tmp_path / "r"
    proc = _start_run(out, ckpt)
    _wait_for_episodes(out, 2)
    proc.send_signal(sig)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    kept = _assert_consistent(out)
    assert f"interrupted: {kept} whole episode(s)" in err, err
    assert json.loads((out / "summary.json").read_text())["episodes"] == kept


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs (needs root, as in CI); skipped where it cannot be mounted."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_is_one_line_and_both_formats_agree(ckpt, small_disk):
    """Running out of disk mid-run: exit 1, one line saying what was kept, npz and HDF5 hold the same whole episodes."""
    out = small_disk / "r"
    res = rollcap("run", "--episodes", 200, "--out", out, "--no-progress", *ckpt)
    assert res.returncode == 1, res.stdout + res.stderr[-2000:]
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "No space left on device" in res.stderr and "whole episode(s) of this session kept" in res.stderr
    kept = [r.index for r in load_any(out / "episodes")]
    assert kept and kept == [r.index for r in load_any(out / "episodes.hdf5")] == list(range(len(kept)))
    assert f"{len(kept)} whole episode(s)" in res.stderr


def test_an_env_id_read_from_a_file_never_imports_a_module(tmp_path):
    """A recording whose env id is 'this:NoSuchEnv-v0': env replay refuses naming the file, and Python's `this` is never imported."""
    from dataclasses import replace

    from rollcap.rollout.recording import synthetic_record, write_npz

    path = tmp_path / "episode_00000.npz"
    write_npz(replace(synthetic_record(steps=4), env_id="this:NoSuchEnv-v0"), path)
    res = rollcap("replay", path, "--mode", "env")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "The Zen of Python" not in res.stdout + res.stderr
    assert "FAILED" in res.stdout and str(path) in res.stdout and "not a registered gymnasium env" in res.stdout


def test_closed_replay_of_an_intervened_episode_is_exact(ckpt, tmp_path):
    """An episode with a human takeover and a keyboard stop, recorded in-process: the CLI's closed-loop replay re-issues those inputs and is exact."""
    import numpy as np

    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.events import EventBus
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.protocols import Subscriber
    from rollcap.rollout.recording import EpisodeRecorder

    bus = EventBus()

    class Operator(Subscriber):
        def on_step(self, step):
            if step.step == 2:
                bus.intervene(np.array([0.5, 0.25], np.float32))
            elif step.step == 5:
                bus.intervene(None)
            elif step.step == 9:
                bus.request_stop("keyboard")

    env_kw = json.loads(ckpt[5])
    parts = Parts(policy=ckpt[1], critic=ckpt[3], env_kwargs=env_kw)
    env = make_env(parts.env_id, env_kw)
    policy, critic = make_runners(parts, env)
    rec = EpisodeRecorder(tmp_path / "r")
    try:
        RolloutHost(env, policy, critic, HostConfig(seed=3), [Operator(), rec], events=bus).run_episode(0)
    finally:
        rec.close()
        policy.close()
        critic.close()
    recorded = load_any(tmp_path / "r")[0]
    assert recorded.stop_reason == "keyboard" and (recorded.steps["actor"] == 1).sum() == 3
    res = rollcap("replay", tmp_path / "r", "--mode", "env,closed", *ckpt)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "2 exact, 0 diverged" in res.stdout


def test_teleop_scripted_run_labels_discards_takes_over_and_quits(ckpt, tmp_path):
    """rollcap run --teleop scripted:FILE: a takeover and a success label are recorded, a discarded episode is
    re-recorded under its index, quit ends the run; every episode replays exactly (closed loop re-issues the inputs)."""
    keys = tmp_path / "keys.txt"
    keys.write_text(
        "step=2 t\nstep=2 right down\nstep=5 right up\nstep=5 t\nstep=8 y\nstep=9 e\n0.05 g\nstep=3 r\n0.05 g\nstep=4 q\n"
    )
    out = tmp_path / "r"
    res = rollcap("run", "--episodes", 5, "--out", out, "--teleop", f"scripted:{keys}", "--no-progress", *ckpt)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    recs = load_any(out)
    assert [r.index for r in recs] == [0, 1] == [r.index for r in load_any(out / "episodes.hdf5")]
    first = recs[0]
    assert first.stop_reason == "keyboard" and first.success and (first.steps["actor"] == 1).sum() == 3
    assert json.loads((out / "summary.json").read_text())["dropped"] == 1
    res = rollcap("replay", out, *ckpt)
    assert res.returncode == 0 and "-- all exact" in res.stdout, res.stdout + res.stderr[-2000:]
    res = rollcap("run", "--out", tmp_path / "x", "--teleop", "keyboard", "--actors", 2, *ckpt)
    assert res.returncode == 2 and "--teleop" in res.stderr, res.stderr
