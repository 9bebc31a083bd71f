"""Chunk-level transitions for offline RL (issue 59): one npz row per executed chunk, read back without pickle."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import rollcap
from rollcap.rollout.config import HostConfig
from rollcap.rollout.gym.envs import NoiseSteeringEnv
from rollcap.rollout.protocols import observation_at
from rollcap.rollout.recording import EpisodeRecorder, synthetic_record
from rollcap.rollout.recording.to_chunks import chunk_rows, export_chunks
from tests.rollout._tiny import make_env, make_runners


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three steered episodes of the tiny noise env: each ends at the chunk limit (its last boundary executes nothing)."""
    out = tmp_path_factory.mktemp("chunks") / "run"
    p, c = make_runners(seed=2)
    rng = np.random.default_rng(0)
    with EpisodeRecorder(out) as rec:
        env = NoiseSteeringEnv(make_env(), p, c, HostConfig(max_chunks=3), subscribers=(rec,))
        for seed in (0, 1, 2):
            env.reset(seed=seed)
            while not any(env.step(rng.standard_normal((4, 2)).astype(np.float32))[2:4]):
                pass
        env.close()
    return out


def test_each_executed_chunk_is_one_transition_with_its_noise_return_and_next_observation(run, tmp_path):
    """Rows follow the recording: the boundary's observation, the noise and chunk, the executed actions, their summed
    (or discounted) return, the next boundary's observation, done at each episode's last chunk; np.load reads it
    with pickle off."""
    records = rollcap.load(run)
    out = export_chunks(run, tmp_path / "t.npz", gamma=0.9, obs_keys=("state",))
    assert (out.episodes, out.transitions, out.skipped) == (3, 9, [])
    with np.load(tmp_path / "t.npz", allow_pickle=False) as z:
        assert sorted(z.files) == sorted(["obs/state", "next_obs/state", "noise", "policy_chunk", "actions", "steps",
                                          "reward", "discount", "terminated", "truncated", "done", "episode", "chunk",
                                          "success", "critic_value", "intervened", "instruction"])  # fmt: skip
        assert z["episode"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and z["chunk"].tolist() == [0, 1, 2] * 3
        assert z["done"].tolist() == [False, False, True] * 3 and not z["terminated"].any()
        assert (z["truncated"] == z["done"]).all() and (z["steps"] == 4).all() and not np.isnan(z["actions"]).any()
        for row in range(9):
            rec, k = records[z["episode"][row]], int(z["chunk"][row])
            s = int(rec.chunks["chunk_start"][k])
            assert np.array_equal(z["obs/state"][row], observation_at(rec, s)["state"])
            assert np.array_equal(z["next_obs/state"][row], observation_at(rec, s + 4)["state"])
            assert np.array_equal(z["noise"][row], rec.chunks["noise"][k])
            assert np.array_equal(z["actions"][row], rec.steps["actions"][s : s + 4])
            assert z["reward"][row] == pytest.approx(sum(0.9**t * rec.steps["rewards"][s + t] for t in range(4)))
            assert z["discount"][row] == pytest.approx(0.9**4) and z["instruction"][row] == rec.instruction
        assert np.array_equal(z["next_obs/state"][:-1][~z["done"][:-1]], z["obs/state"][1:][~z["done"][:-1]])


def test_the_cli_writes_it_and_bad_input_is_one_line(run, tmp_path):
    """`rollcap export RUN --to chunks --root X.npz`; an existing target, a bad --gamma, an unknown key, a flag of
    another format: one line each, exit 2, nothing written."""
    cli = [sys.executable, "-m", "rollcap.rollout.cli", "export", str(run), "--to", "chunks"]
    res = subprocess.run([*cli, "--root", str(tmp_path / "a.npz")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "wrote 9 chunk transition(s) of 3 episode(s)" in res.stdout, res.stderr
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        assert {"obs/image_front", "obs/state"} <= set(z.files) and z["obs/image_front"].dtype == np.uint8
    for flags, line in (
        (["--root", str(tmp_path / "a.npz")], f"--root: {tmp_path / 'a.npz'} exists"),
        (["--root", str(tmp_path / "b.npz"), "--gamma", "0"], "--gamma: expected a number in (0, 1], got 0.0"),
        (["--root", str(tmp_path / "b.npz"), "--fps", "10"], "--fps: not an option of --to chunks"),
    ):
        res = subprocess.run([*cli, *flags], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and line in res.stderr, res.stderr
    for kw, line in (  # the same messages from Python (the CLI names the flag)
        ({"root": tmp_path / "b.npz", "obs_keys": ("nope",)}, r"^obs_keys: \['nope'\] not among"),
        ({"root": tmp_path / "b"}, "^root: expected a new .npz file"),
    ):
        with pytest.raises(ValueError, match=line):
            export_chunks(run, **kw)
    assert not (tmp_path / "b.npz").exists() and not (tmp_path / "b").exists()


def test_a_chunk_stopped_at_its_boundary_is_no_transition_and_rtc_is_refused():
    """A final chunk that executed nothing adds no row (the previous one is done); a real-time-chunking episode is
    refused in one line (its chunks overlap in time)."""
    rec = synthetic_record(steps=16, horizon=8)  # chunks start at 0, 8 and 16: the last stopped before execution
    rows = chunk_rows(rec, ("proprio",), 1.0)
    assert (
        len(rec.chunks["chunk_start"]) == 3
        and [r["chunk"] for r in rows] == [0, 1]
        and [r["steps"] for r in rows] == [8, 8]
    )
    assert rows[-1]["done"] and rows[-1]["terminated"] == bool(rec.steps["terminated"][-1])
    assert any(r["intervened"] for r in rows)
    rtc = replace(rec, chunks={**rec.chunks, "rtc_carried": np.zeros((3, 8, 7), np.float32)})
    with pytest.raises(ValueError, match="^run_dir: episode 0 was recorded with real-time chunking"):
        chunk_rows(rtc, ("proprio",), 1.0)
