"""Replay and branch default to the deployment a recording names: device, backend, precision, policy, critic."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.offline.deployment import recorded_parts, shipped_checkpoints
from rollcap.rollout.recording import EpisodeRecorder, iter_episodes

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]
PREFIX = DEFAULT_CHECKPOINT.parent / "pushblock_policy_prefix.json"


def rollcap(*args, timeout=300):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _digest(path) -> str:
    return json.loads(path.read_text())["weights_digest"]


def _rec(policy: dict, critic: dict | None = None):
    fps = {"policy": policy} | ({"critic": critic} if critic else {})
    return SimpleNamespace(fingerprints=fps)


UNSET = {"device": None, "backend": None, "precision": None, "policy": None, "critic": None, "threads": 1}


def test_a_cuda_recording_on_a_cpu_machine_is_one_line_and_runs_on_cpu(monkeypatch):
    """A CUDA recording without CUDA here: replayed on cpu, and one line says what it needs and what follows."""
    monkeypatch.setattr("rollcap.rollout.offline.deployment._cuda_here", lambda: 0)
    rec = _rec(
        {
            "device_kind": "cuda",
            "cuda_device": "NVIDIA H200",
            "component": "policy",
            "backend": "cuda",
            "precision": "bf16",
            "weights_digest": _digest(DEFAULT_CHECKPOINT),
        }
    )
    parts, said = recorded_parts(dict(UNSET), rec, "runs/x")
    assert (
        parts["device"] == "cpu"
        and "backend" not in parts
        and parts["precision"] == "bf16"
        and parts["policy"] == DEFAULT_CHECKPOINT
    )
    assert said[0] == (
        "runs/x: recorded on cuda (NVIDIA H200, backend cuda); this machine has no CUDA device, so it runs on cpu, where its "
        "episodes are compared but not proven exact (exit 1 unless --accept-not-comparable)"
    )


def test_a_cuda_recording_with_cuda_here_replays_there(monkeypatch):
    """With a CUDA device here the recording's device, backend and precision are taken, and said."""
    monkeypatch.setattr("rollcap.rollout.offline.deployment._cuda_here", lambda: 1)
    rec = _rec(
        {
            "device_kind": "cuda",
            "cuda_device": "NVIDIA H200",
            "component": "policy",
            "backend": "cuda",
            "precision": "tf32",
        }
    )
    parts, said = recorded_parts(dict(UNSET), rec, "r")
    assert (parts["device"], parts["backend"], parts["precision"]) == ("cuda", "cuda", "tf32")
    assert said == [
        "r: recorded on cuda (NVIDIA H200): replaying on cuda",
        "r: recorded at precision tf32: replaying at it",
    ]


def test_flags_win_over_the_recording():
    """A flag the user gave is kept whatever the recording says."""
    rec = _rec({"device_kind": "cpu", "backend": "aoti", "precision": "bf16"})
    parts, said = recorded_parts(UNSET | {"backend": "eager", "precision": "fp32", "policy": "expert"}, rec, "r")
    assert (parts["backend"], parts["precision"], parts["policy"]) == ("eager", "fp32", "expert") and said == []


def test_models_are_found_by_weights_digest_and_a_missing_one_names_its_flag():
    """A shipped checkpoint is found by its digest; a LeRobot or private one names the flag to pass; no critic stays none."""
    assert shipped_checkpoints()[_digest(PREFIX)] == PREFIX
    runner = {"device_kind": "cpu", "component": "policy", "weights_digest": _digest(PREFIX)}  # a captured runner's
    parts, _ = recorded_parts(dict(UNSET), _rec(runner), "r")
    assert parts["policy"] == PREFIX and parts["critic"] is None  # recorded without a critic
    parts, _ = recorded_parts(dict(UNSET), _rec({"kind": "rollcap.expert", "std": 0.3}), "r")
    assert parts["policy"] == "expert:0.3"
    with pytest.raises(
        ConfigError,
        match=r"^policy: r was recorded with a LeRobot policy \(lerobot\.act, weights sha256:0123456789ab\.\.\.\): pass --policy lerobot:DIR",
    ):
        recorded_parts(dict(UNSET), _rec({"kind": "lerobot.act", "weights_digest": "sha256:0123456789abcdef0123"}), "r")
    with pytest.raises(
        ConfigError,
        match=r"critic: r was recorded with a rollcap.ValueCritic whose weights .* no shipped checkpoint has: pass --critic PATH",
    ):
        recorded_parts(
            dict(UNSET),
            _rec(
                runner,
                {"component": "critic", "model": "rollcap.ValueCritic", "weights_digest": "sha256:feed"},
            ),
            "r",
        )
    parts, _ = recorded_parts(
        dict(UNSET), _rec({"kind": "lerobot.act"}), "r", needs_models=False
    )  # --mode env: no models run
    assert "policy" not in parts


@pytest.mark.slow(seconds=60)
def test_bf16_runs_records_and_replays_exact_on_cpu(tmp_path):
    """--precision bf16 runs on CPU, is in the fingerprint (fp32's has none), and replay takes it back: exact."""
    out = tmp_path / "bf16"
    res = rollcap("run", "--episodes", 2, "--max-chunks", 3, "--precision", "bf16", "--no-progress", "--out", out)
    assert res.returncode == 0, res.stderr[-2000:]
    rec = next(iter_episodes(out))[1]
    assert rec.fingerprints["policy"]["precision"] == "bf16" and rec.fingerprints["critic"]["precision"] == "bf16"
    res = rollcap("replay", out)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    assert "recorded at precision bf16: replaying at it" in res.stderr
    assert "6 exact, 0 diverged, 0 not comparable, 0 failed" in res.stdout, res.stdout
    res = rollcap("replay", out, "--precision", "fp32", "--mode", "policy")
    assert res.returncode == 1 and "not comparable" in res.stdout and "precision" in res.stdout, res.stdout


@pytest.mark.slow(seconds=40)
def test_cuda_recording_replayed_on_cpu_prints_the_line(tmp_path):
    """A recording whose fingerprints name CUDA, replayed here: the one line, the CPU comparison, exit 1."""
    src = tmp_path / "cpu"
    assert (
        rollcap("run", "--episodes", 1, "--max-chunks", 2, "--no-progress", "--format", "npz", "--out", src).returncode
        == 0
    )
    rec = copy.deepcopy(next(iter_episodes(src))[1])
    for fp in (rec.fingerprints["policy"], rec.fingerprints["critic"]):
        fp.update({"device_kind": "cuda", "cuda_device": "NVIDIA H200", "backend": "cuda"})
    rec.chunks["policy_chunk"] = (
        rec.chunks["policy_chunk"] + 1e-6
    )  # a GPU's chunks differ from the CPU's in the last bits
    with EpisodeRecorder(tmp_path / "gpu", ("npz",)) as recorder:
        recorder.write(rec)
    res = rollcap("replay", tmp_path / "gpu", "--mode", "policy")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "recorded on cuda (NVIDIA H200, backend cuda); this machine has no CUDA device" in res.stderr
    assert "1 not comparable" in res.stdout and "Traceback" not in res.stderr
    assert rollcap("replay", tmp_path / "gpu", "--mode", "policy", "--accept-not-comparable").returncode == 0


@pytest.mark.slow(seconds=40)
def test_a_run_with_a_shipped_checkpoint_replays_with_it_by_default(tmp_path):
    """A run made with the shipped hard-prefix checkpoint and no critic replays exact with no model flags."""
    out = tmp_path / "prefix"
    res = rollcap(
        "run",
        "--episodes",
        1,
        "--max-chunks",
        3,
        "--policy",
        PREFIX,
        "--critic",
        "none",
        "--no-progress",
        "--format",
        "npz",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    res = rollcap("replay", out)
    assert res.returncode == 0 and "3 exact, 0 diverged" in res.stdout, res.stdout + res.stderr[-2000:]


@pytest.mark.slow(seconds=30)
def test_a_lerobot_recording_names_the_flag_it_needs(tmp_path):
    """A recording made with --policy lerobot:DIR, replayed without it: one line naming the policy and the flag, exit 2."""
    src = tmp_path / "cpu"
    assert (
        rollcap("run", "--episodes", 1, "--max-chunks", 1, "--no-progress", "--format", "npz", "--out", src).returncode
        == 0
    )
    rec = copy.deepcopy(next(iter_episodes(src))[1])
    rec.fingerprints["policy"] = {
        "kind": "lerobot.act",
        "lerobot": "0.6.1",
        "weights_digest": "sha256:" + "ab" * 32,
        "device_kind": "cpu",
    }
    with EpisodeRecorder(tmp_path / "lerobot", ("npz",)) as recorder:
        recorder.write(rec)
    res = rollcap("replay", tmp_path / "lerobot")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert (
        "was recorded with a LeRobot policy (lerobot.act, weights sha256:abababababab...): pass --policy lerobot:DIR"
        in res.stderr
    )
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "lerobot" / "replay").exists()
    res = rollcap("replay", tmp_path / "lerobot", "--mode", "env")  # no model runs in env mode: it replays
    assert res.returncode == 0 and "1 exact" in res.stdout, res.stdout + res.stderr


@pytest.mark.slow(seconds=40)
def test_a_batched_bf16_run_records_both_and_replays_exact(tmp_path):
    """--envs 2 --precision bf16: the batch and the precision are in the fingerprint, and replay with no flags is exact."""
    out = tmp_path / "b"
    res = rollcap(
        "run",
        "--envs",
        2,
        "--episodes",
        2,
        "--max-chunks",
        3,
        "--precision",
        "bf16",
        "--no-progress",
        "--format",
        "npz",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    fp = next(iter_episodes(out))[1].fingerprints
    assert (fp["policy"]["precision"], fp["policy"]["batch"], fp["critic"]["precision"]) == ("bf16", 2, "bf16")
    res = rollcap("replay", out)
    assert res.returncode == 0 and "6 exact, 0 diverged" in res.stdout, res.stdout + res.stderr[-2000:]


def test_settings_of_rollcaps_graphs_are_refused_with_a_policy_object(tmp_path):
    """rollcap.run(policy=<object>, sampler / precision): one ConfigError naming the field, nothing created."""
    import rollcap

    class Mine:
        chunk_shape = (8, 2)

        def reset(self): ...

        def start(self, obs, noise): ...

        def result(self):
            return None

        def state_fingerprint(self):
            return {"policy": "Mine"}

    for field, value in (("sampler", "fused"), ("precision", "bf16")):
        with pytest.raises(
            ConfigError, match=rf"^{field}: '{value}' applies to rollcap's checkpoints; a policy object runs as it is"
        ):
            rollcap.run(episodes=1, out=tmp_path / field, policy=Mine(), progress=False, **{field: value})
        assert not (tmp_path / field).exists()


def test_every_backend_of_the_device_is_taken_back(monkeypatch):
    """A compile-cuda recording replays with compile-cuda where CUDA is present (the backend lists are kernels.graph's)."""
    monkeypatch.setattr("rollcap.rollout.offline.deployment._cuda_here", lambda: 1)
    parts, said = recorded_parts(
        dict(UNSET), _rec({"device_kind": "cuda", "component": "policy", "backend": "compile-cuda"}), "r"
    )
    assert parts["backend"] == "compile-cuda" and "r: recorded with backend compile-cuda: replaying with it" in said


def test_a_policy_of_your_own_without_weights_names_the_env_mode():
    """A recording made by a scripted Python policy (examples/fetch_reach.py's: a kind, no weights): no --policy PATH can
    rebuild it, so the message names --mode env instead of asking for a checkpoint."""
    rec = _rec({"kind": "examples.fetch_reach", "gain": 10.0, "std": 0.05, "numpy": "2"})
    with pytest.raises(ConfigError) as err:
        recorded_parts(dict(UNSET), rec, "runs/fetch")
    assert err.value.field == "policy" and "--mode env" in err.value.problem, err.value
    assert "None" not in err.value.problem and "pass --policy PATH" not in err.value.problem
    parts, _ = recorded_parts(dict(UNSET), rec, "runs/fetch", needs_models=False)  # --mode env runs no model
    assert "policy" not in parts


class _Wrapped:
    """A user's Python ChunkPolicy around the shipped policy (as the issue's user wrote one): its fingerprint names the
    model and the shipped weights digest, not a captured runner's component."""

    def __init__(self):
        from rollcap.policies import PolicyRunner, load_policy

        self.inner = PolicyRunner(load_policy(DEFAULT_CHECKPOINT).eval())
        self.chunk_shape, self.execute_steps = self.inner.chunk_shape, self.inner.execute_steps

    def reset(self) -> None:
        self.inner.reset()

    def start(self, obs, noise) -> None:
        self.inner.start(obs, noise)

    def result(self):
        return self.inner.result()

    def state_fingerprint(self) -> dict:
        return {"device_kind": "cpu", "model": "rollcap.FlowVLA", "weights_digest": _digest(DEFAULT_CHECKPOINT)}

    def close(self) -> None:
        self.inner.close()


@pytest.mark.slow(seconds=30)
def test_a_run_made_with_a_policy_object_replays_with_a_line_naming_the_doors(tmp_path):
    """A run recorded with a Python policy object (here over the shipped weights): `rollcap replay` says in one line
    that rollcap cannot rebuild the object and names --mode env and the Python door (exit 2, nothing replayed; it took
    the shipped checkpoint and reported a fingerprint diff); --mode env replays it exact, and so does the API with
    the same object."""
    import rollcap as api
    from rollcap.rollout.offline.replay import replay_policy

    policy = _Wrapped()
    result = api.run(1, out=tmp_path / "r", policy=policy, critic=None, max_chunks=2, progress=False)
    res = rollcap("replay", tmp_path / "r")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "was recorded with a policy object of your own (rollcap.FlowVLA, weights sha256:" in lines[0]
    assert (
        "rollcap cannot rebuild" in lines[0]
        and "--mode env" in lines[0]
        and "replay_policy(record, policy)" in lines[0]
    )
    assert "not comparable" not in res.stdout
    res = rollcap("replay", tmp_path / "r", "--mode", "env")
    assert res.returncode == 0 and "all exact" in res.stdout, res.stdout + res.stderr
    rec = next(iter(result.records()))
    assert replay_policy(rec, policy).exact
