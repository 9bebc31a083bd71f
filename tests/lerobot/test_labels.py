"""`rollcap export --labels expert`: DART-style datasets (executed with noise, labelled by the clean expert),
LeRobotDataset v3 and Minari, read back; refusals in one line. Run in LeRobot's venv:

    bash scripts/lerobot_env.sh && HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip(
    "lerobot", reason="lerobot is not installed here; it lives in its own venv (bash scripts/lerobot_env.sh)"
)
pytest.importorskip(
    "minari", reason="minari is not installed here (it is in LeRobot's venv: bash scripts/lerobot_env.sh)"
)

from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.rollout.recording import load_any, synthetic_record, write_npz
from rollcap.rollout.recording.labels import EXPERT_LABELS_NOTE
from rollcap.rollout.recording.to_minari import export_minari

pytestmark = pytest.mark.lerobot
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def rollcap(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        check=False,
    )


def clean(state, instruction) -> np.ndarray:
    expert = ScriptedExpert(ExpertNoise())
    expert.reset(0)
    return expert.act({"state": np.asarray(state, np.float32), "instruction": instruction})


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Two episodes of `rollcap run --policy expert:0.3` (noise from the host), 16 steps, with images."""
    out = tmp_path_factory.mktemp("dart") / "demos"
    res = rollcap(
        "run",
        "--policy",
        "expert:0.3",
        "--critic",
        "none",
        "--episodes",
        2,
        "--seed",
        9,
        "--env-kwargs",
        '{"max_steps": 16}',
        "--format",
        "npz",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def test_export_cli_expert_labels(demos, tmp_path):
    """Each exported action is the clean expert's action on that frame's own state and task; the executed action differs; info.json says so."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    res = rollcap(
        "export",
        demos,
        "--to",
        "lerobot",
        "--root",
        tmp_path / "ds",
        "--labels",
        "expert",
        "--obs-keys",
        "state",
        "--instruction-dims",
        32,
        "--extras",
        "",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    records = sorted(load_any(demos), key=lambda r: r.index)
    ds = LeRobotDataset("rollcap/ds", root=tmp_path / "ds")
    assert len(ds) == sum(r.num_steps for r in records) == 32
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["rollcap_labels"] == "expert" and info["rollcap_labels_note"] == EXPERT_LABELS_NOTE
    differs = []
    for i in range(len(ds)):
        f = ds[i]
        rec, t = records[int(f["episode_index"])], int(f["frame_index"])
        assert (
            f["task"] == rec.instruction and f["observation.state"].numpy().tobytes() == rec.obs["state"][t].tobytes()
        )
        assert f["action"].numpy().tobytes() == clean(f["observation.state"].numpy(), f["task"]).tobytes()
        differs.append(not np.array_equal(f["action"].numpy(), rec.steps["actions"][t]))
    assert np.mean(differs) > 0.9  # the executed (noisy) actions are not the labels
    res = rollcap(
        "export", demos, "--to", "lerobot", "--root", tmp_path / "plain", "--obs-keys", "state", "--extras", ""
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "rollcap_labels" not in json.loads((tmp_path / "plain" / "meta" / "info.json").read_text())
    plain = LeRobotDataset("rollcap/plain", root=tmp_path / "plain")
    assert plain[3]["action"].numpy().tobytes() == records[0].steps["actions"][3].tobytes()


def test_export_minari_expert_labels(demos, tmp_path, monkeypatch):
    """Minari: the actions are the clean expert's on each recorded observation; the description says they are relabelled."""
    import minari

    out = export_minari(
        demos,
        "rollcap/dart-v0",
        root=tmp_path / "minari",
        labels="expert",
        author="rollcap tests",
        author_email="tests@rollcap.invalid",
        code_permalink="tests/lerobot/test_labels.py",
    )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out.root))
    ds = minari.load_dataset(out.dataset_id)
    assert EXPERT_LABELS_NOTE in ds.storage.metadata["description"]
    for rec, ep in zip(sorted(load_any(demos), key=lambda r: r.index), ds.iterate_episodes(), strict=True):
        want = np.stack([clean(s, rec.instruction) for s in ep.observations["state"][:-1]])
        assert ep.actions.tobytes() == want.tobytes() and not np.array_equal(ep.actions, rec.steps["actions"])


@pytest.mark.parametrize("to", ["lerobot", "minari"])
def test_export_cli_refuses_expert_labels_for_another_env(tmp_path, to):
    """A recording of an env the expert does not know: one line naming --labels, exit 2, nothing written."""
    (tmp_path / "run").mkdir()
    write_npz(synthetic_record(0, 1, steps=3), tmp_path / "run" / "episode_00000.npz")
    res = rollcap("export", tmp_path / "run", "--to", to, "--root", tmp_path / "out", "--labels", "expert")
    assert res.returncode == 2 and "--labels: the scripted expert knows only the built-in task" in res.stderr, (
        res.stderr
    )
    assert len(res.stderr.strip().splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["run"]
