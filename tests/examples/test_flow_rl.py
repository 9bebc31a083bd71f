"""The flow-RL examples: examples/flow_rl.py trains, keeps and scores held-out on a tiny budget and refuses a bad flag
in one line (exit 2); examples/flow_rl_gym.py runs its minimal loop through the gym door."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example(*flags, timeout=600):
    cmd = [sys.executable, str(ROOT / "examples" / "flow_rl.py"), *map(str, flags)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow(seconds=40)
def test_the_example_trains_keeps_and_scores_held_out(tmp_path):
    """The door: 2 iterations with held-in checkpoints, then 3 held-out episodes paired against the starting policy;
    policy.json is the kept weights, result.json names the streams, the budget and the held-out table."""
    out = tmp_path / "run"
    res = _example("--max-iterations", 2, "--groups", 2, "--group-size", 2, "--heldin-every", 1, "--heldin-episodes", 2,
                   "--heldin-envs", 2, "--eval-episodes", 3, "--eval-seed", 77, "--out", out, "--log-every-s", 0)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.startswith("streams (named before training): ") and "held-out, own noise: " in res.stdout
    r = json.loads((out / "result.json").read_text())
    assert r["streams"]["held_out"]["run_seed"] == 77 and r["budget"]["iterations"] == 2
    assert r["eval"]["own"]["episodes"] == 3 and len(r["held_in"]) == 3 and r["kept"] is not None
    assert (out / "policy.json").is_file() and (tmp_path / "baseline-pushblock-77-3.json").is_file()


def _parse(argv):
    import importlib.util

    spec = importlib.util.spec_from_file_location("flow_rl_example", ROOT / "examples" / "flow_rl.py")
    mod = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(mod)  # registered first: its dataclasses look their module up
    return mod.parse(argv)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "2"], "--lr: expected a number in (0, 1), got 2.0"),
        (["--algorithm", "sac"], "--algorithm: expected one of grpo, ppo, got 'sac'"),
        (["--advantage", "branch", "--algorithm", "ppo"], "--advantage: branch is grpo's"),
        (["--advantage", "branch", "--max-start", "3"], "--advantage: branch splits episodes"),
        (["--eval-seed", "500001"], "--eval-seed: eval_seed 500001 is a training run seed or a held-in one"),
        (["--resume"], "--resume: "),
        (["--noise-level", "9"], "--noise-level: expected a number in (0, 4], got 9.0"),
        (["--groups", "0"], "--groups: expected an integer in 1..256, got 0"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    """A bad flag: one line naming it on stderr, exit 2, nothing written."""
    with pytest.raises(SystemExit) as err:
        _parse([*flags, "--out", str(tmp_path / "run")])
    out = capsys.readouterr()
    assert err.value.code == 2 and out.out == "", out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow(seconds=5)
def test_a_bad_flag_from_the_command_line(tmp_path):
    """The same refusal from a real process: exit 2, one line, no traceback."""
    res = _example("--minutes", "-1", "--out", tmp_path / "run", timeout=120)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "--minutes: expected" in res.stderr


@pytest.mark.slow(seconds=25)
def test_the_minimal_gym_loop_example_runs():
    """examples/flow_rl_gym.py: one GRPO iteration through the vector env, its weights back in place, no capture."""
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "flow_rl_gym.py"), "--iterations", "1"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "iteration 0: success " in run.stdout and "graphs captured since the env was made: 0" in run.stdout


def test_a_resumed_run_keeps_the_held_out_stream_it_named(tmp_path, capsys):
    """--resume takes the held-out run seed, size and baseline from the run's streams.json (named before training), not
    this call's defaults; another --eval-seed is one line naming it."""
    _parse(["--out", str(tmp_path / "probe")])  # loads the example module
    mod = sys.modules["flow_rl_example"]
    out = tmp_path / "run"
    (out / "state").mkdir(parents=True)
    cfg = mod.TrainConfig()
    meta = {"config": cfg.to_json(), "start": str(mod.start_checkpoint(cfg, None))}
    (out / "state" / "state.json").write_text(json.dumps({"meta": meta}))
    base = tmp_path / "base.json"  # the starting side it was to be paired with (checked: task, run seed, size)
    base.write_text(json.dumps({"task": "pushblock", "eval_seed": 9002, "frozen": [True] * 50}))
    streams = {"held_out": {"run_seed": 9002, "episodes": 50}, "baseline": str(base)}
    (out / "streams.json").write_text(json.dumps(streams))
    args, _, eval_seed = _parse(["--out", str(out), "--resume"])
    assert (eval_seed, args.eval_episodes, args.baseline) == (9002, 50, base)
    with pytest.raises(SystemExit) as err:
        _parse(["--out", str(out), "--resume", "--eval-seed", "9003"])
    assert err.value.code == 2 and "--eval-seed: the run in" in capsys.readouterr().err
