"""kernels.files: atomic writes (umask, explicit mode, nothing left on failure) and canonical JSON."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from rollcap.kernels.files import atomic_write, canonical_json, plain_json, remove_stale_temps


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_write_follows_the_umask(tmp_path, umask):
    """Without a mode the file gets 0o666 less the umask, like any file the user writes."""
    old = os.umask(umask)
    try:
        atomic_write(tmp_path / "f", lambda p: Path(p).write_text("x"))
        with open(tmp_path / "g", "w") as fh:
            fh.write("y")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o666 & ~umask == _mode(tmp_path / "g")


def test_atomic_write_explicit_mode_and_replace(tmp_path):
    """An explicit mode wins over the umask; an existing file is replaced whole."""
    path = tmp_path / "f.json"
    path.write_text("old")
    old = os.umask(0o077)
    try:
        atomic_write(path, lambda p: Path(p).write_text("new"), mode=0o644)
    finally:
        os.umask(old)
    assert path.read_text() == "new" and _mode(path) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, exc):
    """Any exception, Ctrl-C included: the old file stays, the temp file is gone."""
    path = tmp_path / "f"
    path.write_text("old")

    def write(p: str) -> None:
        Path(p).write_text("half")
        raise exc

    with pytest.raises(type(exc)):
        atomic_write(path, write)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f"]


def test_remove_stale_temps(tmp_path):
    """Only hidden ``*.tmp`` files go."""
    (tmp_path / ".a.npz.1234.tmp").write_bytes(b"")
    (tmp_path / "keep.tmp").write_bytes(b"")
    (tmp_path / ".keep").write_bytes(b"")
    assert [p.name for p in remove_stale_temps(tmp_path)] == [".a.npz.1234.tmp"]
    assert sorted(os.listdir(tmp_path)) == [".keep", "keep.tmp"]


def test_canonical_json():
    """Sorted keys, no spaces, UTF-8 text, numpy as plain values; indent keeps keys sorted."""
    obj = {"b": (1, np.float32(0.5)), "a": {"z": np.arange(2), "é": np.bool_(True)}, "n": np.int64(2**40)}
    assert canonical_json(obj) == '{"a":{"z":[0,1],"é":true},"b":[1,0.5],"n":1099511627776}'
    assert canonical_json(obj, indent=1) == json.dumps(plain_json(obj), indent=1, sort_keys=True, ensure_ascii=False)
    assert plain_json(obj) == {"a": {"z": [0, 1], "é": True}, "b": [1, 0.5], "n": 2**40}
    assert canonical_json(float("nan")) == "NaN"
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")}, allow_nan=False)
    with pytest.raises(TypeError, match="object"):
        canonical_json({"x": object()})


def test_report_json_writes_undefined_figures_as_null_for_strict_readers(tmp_path):
    """NaN and infinities (no critic timed, one sample's interval) become null; the rest is canonical_json's."""
    from rollcap.kernels.files import report_json

    obj = {"b": [1.5, float("nan"), (float("-inf"), np.float32(2.0))], "a": {"x": float("inf"), "y": None, "z": "s"}}
    text = report_json(obj)
    got = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}"))
    assert got == {"a": {"x": None, "y": None, "z": "s"}, "b": [1.5, None, [None, 2.0]]}
    assert report_json({"k": 1}) == canonical_json({"k": 1}, indent=2)


def test_a_run_without_a_critic_writes_a_strict_summary(tmp_path):
    """The run's summary.json holds null where nothing was timed (here the critic), never NaN."""
    import rollcap

    rollcap.run(episodes=1, out=tmp_path / "r", policy="expert", critic="none", progress=False)
    text = (tmp_path / "r" / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    assert summary["critic_ms_median"] is None and summary["policy_ms_median"] > 0
