"""What works in any environment: the adapter and exporters import, map features and refuse bad input without lerobot."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from rollcap.policies.lerobot import LeRobotPolicy, map_features, require_lerobot
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
    feats = {"observation.state": SimpleNamespace(shape=(28,)), "observation.images.front": SimpleNamespace(shape=(3, 64, 64)), "observation.image": SimpleNamespace(shape=(3, 64, 64))}
    keys = ["state", "image_front", "instruction"]
    assert map_features(feats, keys) == {"observation.state": "state", "observation.images.front": "image_front", "observation.image": "image_front"}
    with pytest.raises(ValueError, match="'observation.images.wrist'") as err:
        map_features({"observation.images.wrist": SimpleNamespace(shape=(3, 8, 8))}, keys)
    assert "\n" not in str(err.value)
    assert map_features({"observation.images.wrist": SimpleNamespace(shape=())}, keys, {"observation.images.wrist": "image_front"}) == {"observation.images.wrist": "image_front"}
    with pytest.raises(ValueError, match="keys: 'observation.nope'"):
        map_features(feats, keys, {"observation.nope": "state"})


@pytest.mark.parametrize("to", ["lerobot", "minari"])
def test_exporters_refuse_bad_input_before_importing(tmp_path, to):
    """Not a run dir, an unknown extra, an existing non-empty target: one-line ValueErrors naming the argument; nothing written."""
    export = (lambda run, out, **kw: export_lerobot(run, out, **kw)) if to == "lerobot" else (lambda run, out, **kw: export_minari(run, "ns/d-v0", root=out, **kw))
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
