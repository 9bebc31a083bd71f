"""What works in any environment: the adapter and exporters import, map features and refuse bad input without lerobot."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rollcap.policies.lerobot import LeRobotPolicy
from rollcap.policies.lerobot_features import map_features, require_lerobot
from rollcap.rollout.recording.to_lerobot import export_lerobot
from rollcap.rollout.recording.to_minari import export_minari

HAS_LEROBOT = importlib.util.find_spec("lerobot") is not None


@pytest.mark.skipif(HAS_LEROBOT, reason="lerobot is importable here: nothing to refuse")
def test_refuses_cleanly_without_lerobot(tmp_path):
    """Loading a saved policy without lerobot raises ImportError naming the script that builds its venv."""
    (tmp_path / "config.json").write_text('{"type": "act"}')
    with pytest.raises(ImportError, match="scripts/lerobot_env.sh"):
        LeRobotPolicy.load(tmp_path)
    with pytest.raises(ImportError, match="lerobot is not importable"):
        require_lerobot()


def test_load_names_a_directory_without_config(tmp_path):
    """A directory that save_pretrained did not write is a one-line ValueError naming it."""
    with pytest.raises(ValueError, match=f"{tmp_path}: no config.json") as err:
        LeRobotPolicy.load(tmp_path)
    assert "\n" not in str(err.value)


def test_map_features_defaults_and_missing_feature():
    """state / image_X / the one image map by default; an unmappable feature is a one-line ValueError naming it."""
    feats = {
        "observation.state": SimpleNamespace(shape=(28,)),
        "observation.images.front": SimpleNamespace(shape=(3, 64, 64)),
        "observation.image": SimpleNamespace(shape=(3, 64, 64)),
    }
    keys = ["state", "image_front", "instruction"]
    assert map_features(feats, keys) == {
        "observation.state": "state",
        "observation.images.front": "image_front",
        "observation.image": "image_front",
    }
    with pytest.raises(ValueError, match="'observation.images.wrist'") as err:
        map_features({"observation.images.wrist": SimpleNamespace(shape=(3, 8, 8))}, keys)
    assert "\n" not in str(err.value)
    assert map_features(
        {"observation.images.wrist": SimpleNamespace(shape=())}, keys, {"observation.images.wrist": "image_front"}
    ) == {"observation.images.wrist": "image_front"}
    with pytest.raises(ValueError, match="keys: 'observation.nope'"):
        map_features(feats, keys, {"observation.nope": "state"})


@pytest.mark.parametrize("to", ["lerobot", "minari"])
def test_exporters_refuse_bad_input_before_importing(tmp_path, to):
    """Not a run dir, an unknown extra, an existing non-empty target: one-line ValueErrors naming the argument; nothing written."""
    export = (
        (lambda run, out, **kw: export_lerobot(run, out, **kw))
        if to == "lerobot"
        else (lambda run, out, **kw: export_minari(run, "ns/d-v0", root=out, **kw))
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"run_dir: .*empty.* is not a rollcap recording"):
        export(empty, tmp_path / "out")
    with pytest.raises(ValueError, match="run_dir: .* does not exist"):
        export(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ValueError, match="extras: unknown feature 'colour'"):
        export(empty, tmp_path / "out", extras=("reward", "colour"))
    busy = tmp_path / "busy"
    (busy / "ns" / "d-v0").mkdir(parents=True)
    (busy / "ns" / "d-v0" / "x").write_text("x")
    (busy / "x").write_text("x")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        export(empty, busy)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "empty"]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.skipif(HAS_LEROBOT, reason="lerobot is importable here: nothing to refuse")
def test_cli_refuses_lerobot_doors_in_one_line(tmp_path):
    """`run --policy lerobot:DIR` and `export --to lerobot` without lerobot: one line naming the script, exit 2, nothing created."""
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text('{"type": "act"}')
    res = _cli("run", "--policy", f"lerobot:{tmp_path / 'policy'}", "--episodes", 1, "--out", tmp_path / "out")
    assert (
        res.returncode == 2 and "scripts/lerobot_env.sh" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    ), res.stderr
    res = _cli("export", tmp_path, "--to", "lerobot", "--root", tmp_path / "ds")
    assert (
        res.returncode == 2 and "scripts/lerobot_env.sh" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    ), res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]


@pytest.mark.slow
def test_expert_policy_records_and_replays_exactly(tmp_path):
    """`--policy expert:0.2` (the scripted expert, noise from the host) records demonstrations that replay exact."""
    out = tmp_path / "demos"
    res = _cli(
        "run",
        "--policy",
        "expert:0.2",
        "--critic",
        "none",
        "--episodes",
        2,
        "--env-kwargs",
        '{"max_steps": 20}',
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    res = _cli("replay", out, "--policy", "expert:0.2", "--critic", "none")
    assert res.returncode == 0 and res.stdout.splitlines()[-1].endswith("all exact"), res.stdout[-2000:]
    res = _cli("replay", out, "--policy", "expert", "--critic", "none", "--mode", "policy")
    assert res.returncode == 1 and "not comparable" in res.stdout, res.stdout[-2000:]
    res = _cli("run", "--policy", "expert:2", "--episodes", 1, "--out", tmp_path / "bad")
    assert (
        res.returncode == 2
        and "--policy: expert:2: expected expert or expert:STD" in res.stderr
        and not (tmp_path / "bad").exists()
    )


def test_instruction_vector_tells_the_tasks_apart():
    """The built-in task's 9 instructions give 9 different hashed bags of words; bad dims are refused."""
    from rollcap.envs.scene import BLOCKS, TARGETS, make_instruction
    from rollcap.policies.lerobot_features import instruction_vector

    vecs = {
        instruction_vector(make_instruction(b, t), 32).tobytes()
        for b in range(len(BLOCKS))
        for t in range(len(TARGETS))
    }
    assert len(vecs) == 9
    with pytest.raises(ValueError, match="instruction_dims: expected an integer >= 1"):
        instruction_vector("push", 0)
