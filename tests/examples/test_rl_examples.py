"""The RL examples of issue 59, each at a smoke size in a subprocess: SB3 on the batched core (sb3_batched.py),
residual RL on ChunkEnv (residual_rl.py), and dsrl.py's --load and --tensorboard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("tensorboard")  # the rl extra holds both: --tensorboard is part of each smoke run

pytestmark = pytest.mark.slow  # subprocesses: the fast tier (-m "not slow") leaves them to the full suite

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str, *flags, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "examples" / name), *map(str, flags)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _events(path: Path) -> list[Path]:
    return list(path.rglob("events.out.tfevents.*"))


@pytest.mark.slow(seconds=25)
def test_sb3_batched_example_trains_on_one_graph_and_scores_held_out(tmp_path):
    """SAC on 2 sub-envs of the batched core (PPO's run is test_rl_tools.py's): it trains (SB3's success rate logged,
    TensorBoard events written), then the agent and zero noise play the same 2 held-out episodes, paired."""
    algo, out = "sac", tmp_path / "run"
    res = _example("sb3_batched.py", "--algo", algo, "--envs", 2, "--timesteps", 48, "--learning-starts", 16,
                   "--max-chunks", 3, "--eval-episodes", 2, "--tensorboard", out / "tb", "--out", out)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "on 2 sub-envs (one graph at batch 2)" in res.stdout and "success_rate" in res.stdout, res.stdout[-2000:]
    report = json.loads((out / "result.json").read_text())
    assert len(report["eval"]["agent"]) == len(report["eval"]["baseline"]) == 2
    assert any(line.startswith(f"{algo.upper()} (deterministic) - zero noise: ") for line in report["eval"]["lines"])
    assert _events(out / "tb")


@pytest.mark.slow(seconds=25)
def test_residual_rl_example_starts_as_the_frozen_policy(tmp_path):
    """Residual SAC on ChunkEnv, 2 sub-envs on the batched core (the single env's residual is test_rl_tools.py's): it
    trains and is scored against the zero residual, which is the frozen policy, on the same held-out episodes."""
    envs, out = 2, tmp_path / "run"
    res = _example("residual_rl.py", "--envs", envs, "--timesteps", 32, "--learning-starts", 16, "--max-chunks", 4,
                   "--eval-episodes", 2, "--tensorboard", out / "tb", "--out", out)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((out / "result.json").read_text())
    assert len(report["eval"]["agent"]) == len(report["eval"]["baseline"]) == 2
    assert "residual SAC (deterministic) - frozen policy (zero residual): " in res.stdout and _events(out / "tb")


@pytest.mark.parametrize(
    "name, flags, line",
    [
        ("sb3_batched.py", ["--envs", "0"], "sb3_batched.py: --envs: expected an integer >= 1, got 0"),
        (
            "sb3_batched.py",
            ["--noise-bound", "9"],
            "sb3_batched.py: --noise-bound: expected a number in (0, 4], got 9.0",
        ),
        ("residual_rl.py", ["--residual", "0"], "residual_rl.py: --residual: expected a number > 0, got 0.0"),
        (
            "residual_rl.py",
            ["--eval-episodes", "0"],
            "residual_rl.py: --eval-episodes: expected an integer >= 1, got 0",
        ),
    ],
)
def test_the_rl_examples_refuse_a_bad_flag_in_one_line(name, flags, line):
    """A bad flag: one line naming it, exit 2, nothing built."""
    res = _example(name, *flags, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [line], res.stderr


DSRL_SMALL = ["--task", "pushblock", "--max-transitions", "32", "--num-envs", "2", "--init-steps", "8", "--hidden", "32",
              "--log-every-s", "0", "--heldin-every", "16", "--heldin-episodes", "2", "--heldin-envs", "2"]  # fmt: skip


@pytest.mark.slow(seconds=60)
def test_dsrl_example_logs_to_tensorboard_and_load_evaluates_the_saved_agent(tmp_path):
    """dsrl.py --tensorboard writes the training curve and the held-in checkpoints as event files; --load of the agent
    it saved evaluates it alone (no training) on the same held-out episodes, with the same outcomes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    res = _example("dsrl.py", *DSRL_SMALL, "--eval-episodes", 2, "--tensorboard", tmp_path / "tb", "--out", run)
    assert res.returncode == 0, res.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    tags = events.Tags()["scalars"]
    assert "held_in/success_rate" in tags and "train/transitions" in tags, tags
    assert [e.step for e in events.Scalars("held_in/success_rate")] == [0, 16, 32]
    trained = json.loads((run / "result.json").read_text())["eval"]
    res = _example("dsrl.py", "--load", run / "agent.safetensors", "--eval-episodes", 2, "--out", tmp_path / "again")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith(f"evaluating {run / 'agent.safetensors'} (task pushblock, view state, DSRL-NA")
    again = json.loads((tmp_path / "again" / "result.json").read_text())
    assert again["eval"]["steered"] == trained["steered"] and again["eval"]["episode_seeds"] == trained["episode_seeds"]
    assert not (tmp_path / "again" / "agent.safetensors").exists()  # nothing trained
    res = _example("dsrl.py", "--load", run / "result.json", "--out", tmp_path / "bad", timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"dsrl.py: error: --load: {run / 'result.json'}: expected an agent*.safetensors file this script wrote"
    ], res.stderr
