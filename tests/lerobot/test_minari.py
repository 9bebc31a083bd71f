"""`rollcap export --to minari` as a user runs it: a relative --root, the env's own spaces in the dataset, and one line
for each thing Minari warns about. Needs minari only (LeRobot's venv has it):

    bash scripts/lerobot_env.sh && HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip(
    "minari", reason="minari is not installed here (it is in LeRobot's venv: bash scripts/lerobot_env.sh)"
)

import minari
from gymnasium import spaces

import rollcap
from rollcap.rollout.errors import ExportWarning
from rollcap.rollout.recording.to_minari import export_minari

pytestmark = pytest.mark.lerobot


def rollcap_cli(*args, cwd) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Two episodes of the built-in task with the shipped policy, no critic."""
    out = tmp_path_factory.mktemp("minari") / "run"
    rollcap.run(2, out=out, critic="none", max_chunks=3, progress=False, formats=("npz",))
    return out


def test_a_relative_root_writes_the_dataset_there_and_a_failure_leaves_nothing(run_dir, tmp_path):
    """`--root ds` (relative): the dataset lands in ./ds/<id> (the path used to be doubled: exit 2 and an empty ds/rollcap
    left behind); an export Minari refuses leaves no directory it made."""
    res = rollcap_cli("export", run_dir, "--to", "minari", "--root", "ds", "--author", "a", "--author-email", "a@b.c",
                      "--code-permalink", "https://example.invalid/rollcap", cwd=tmp_path)  # fmt: skip
    said = [ln for ln in res.stderr.splitlines() if "outside the env's space" not in ln]  # the clipped actions' line
    assert res.returncode == 0 and said == [], res.stderr[-2000:]
    assert (tmp_path / "ds" / "rollcap" / "run-v0" / "data" / "main_data.hdf5").is_file()
    res = rollcap_cli("export", run_dir, "--to", "minari", "--root", "other", "--dataset-id", "bad id!", cwd=tmp_path)
    assert res.returncode == 2 and "--dataset-id" in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "other").exists()


def test_the_dataset_declares_the_envs_spaces(run_dir, tmp_path, monkeypatch):
    """Action space Box(-1, 1) and the state's bounds and the instruction's Text space, as the env declares them (were
    Box(-inf, inf) and Text(0, 1024)); the data reads back as recorded; actions the env clipped are counted, one line."""
    env = rollcap.make_env(rollcap.rollout.spec.DEFAULT_ENV)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = export_minari(run_dir, "rollcap/spaces-v0", root=tmp_path, author="a", author_email="a@b.c",
                            code_permalink="https://example.invalid/rollcap")  # fmt: skip
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out.root))
    ds = minari.load_dataset(out.dataset_id)
    assert ds.spec.action_space == env.action_space and ds.spec.action_space.low.min() == -1.0
    for key in ("state", "image_front", "instruction"):
        assert ds.spec.observation_space[key] == env.observation_space[key], key
    assert isinstance(ds.spec.observation_space["instruction"], spaces.Text)
    env.close()
    records = rollcap.rollout.recording.load_any(run_dir)
    clipped = sum(int(np.count_nonzero((np.abs(r.steps["actions"]) > 1).any(axis=1))) for r in records)
    assert out.outside == ({"actions": clipped} if clipped else {})
    ours = [str(w.message) for w in said if issubclass(w.category, ExportWarning)]
    assert len(ours) == len(said) == bool(clipped), [str(w.message) for w in said]


def test_missing_attribution_is_one_line_naming_the_flags_not_three_warnings(run_dir, tmp_path):
    """No --author, --author-email, --code-permalink: Minari's three UserWarnings are one rollcap line naming the flags;
    giving them leaves nothing to say."""
    res = rollcap_cli("export", run_dir, "--to", "minari", "--root", tmp_path / "ds", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if "outside the env's space" not in ln]
    assert lines == [
        "rollcap: warning: Minari export: the dataset names no author, author_email, code_permalink (Minari recommends "
        "them: who made it, with what code); rollcap export: --author, --author-email, --code-permalink"
    ], res.stderr
