"""Bad recordings and bad paths: one line naming the file, exit 2 through the CLI, nothing allocated or written."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.offline.inspect import check_plot_dir, plot_episodes
from rollcap.rollout.recording import load_any
from rollcap.rollout.recording import EpisodeRecorder, read_npz, records_equal, synthetic_record

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    with EpisodeRecorder(tmp_path / "run", formats=("npz",), env_meta=ENV_META) as rec:
        for i in range(2):
            rec.write(synthetic_record(i, 7 + i, steps=6, image_size=16))
    return tmp_path / "run"


def _rewrite_member(src: Path, dst: Path, name: str, raw: bytes, compress_type: int | None = None) -> None:
    """Copy the npz ``src`` to ``dst`` with member ``name`` replaced by ``raw``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        assert name in zin.namelist()
        for info in zin.infolist():
            data = raw if info.filename == name else zin.read(info)
            zout.writestr(
                info.filename, data, compress_type=info.compress_type if compress_type is None else compress_type
            )


def _npy(header: dict, payload: bytes) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + payload


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *args], capture_output=True, text=True, timeout=120
    )


def _assert_one_line_exit_2(proc: subprocess.CompletedProcess, names: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and names in proc.stderr


def test_npz_header_declaring_1e12_elements_is_corrupt_not_memoryerror(run_dir, tmp_path):
    """An .npy header claiming 10^12 float32 is checked against the member's size before anything is allocated."""
    src = run_dir / "episodes" / "episode_00000.npz"
    bad = tmp_path / "huge.npz"
    _rewrite_member(
        src, bad, "steps/rewards.npy", _npy({"descr": "<f4", "fortran_order": False, "shape": (10**12,)}, b"\0" * 24)
    )
    with pytest.raises(
        CorruptEpisode,
        match=r"huge.npz: steps/rewards.npy: header declares <f4 \(1000000000000,\) \(4000000000000 bytes\), the archive holds 24",
    ) as info:
        read_npz(bad)
    assert "\n" not in str(info.value)
    _assert_one_line_exit_2(_cli("inspect", str(bad)), str(bad))


def test_npz_unknown_compression_method_is_corrupt(run_dir, tmp_path):
    """A zip member whose compression method is not stored/deflate (here 99) is refused before it is opened."""
    bad = tmp_path / "method.npz"
    raw = bytearray((run_dir / "episodes" / "episode_00000.npz").read_bytes())
    central = raw.find(b"PK\x01\x02")
    raw[central + 10 : central + 12] = (99).to_bytes(2, "little")  # the central directory's method of the first member
    bad.write_bytes(bytes(raw))
    with pytest.raises(
        CorruptEpisode, match=r"method.npz: .*zip compression method 99, expected stored \(0\) or deflate \(8\)"
    ):
        read_npz(bad)
    _assert_one_line_exit_2(_cli("inspect", str(bad)), str(bad))


@pytest.mark.parametrize(
    "header,payload,match",
    [
        ({"descr": "|O", "fortran_order": False, "shape": (2,)}, b"\0" * 16, "dtype |O, expected numbers or bool"),
        ({"descr": "<f4", "fortran_order": False, "shape": (-2, -3)}, b"\0" * 24, r"negative shape"),
        (
            {"descr": "<f4", "fortran_order": False, "shape": (2,)},
            b"\0" * 12,
            "header declares <f4 \\(2,\\) \\(8 bytes\\), the archive holds 12",
        ),
    ],
)
def test_npz_impossible_array_headers_are_corrupt(run_dir, tmp_path, header, payload, match):
    """Object arrays (pickle), negative shapes and sizes that disagree with the member are refused by name."""
    bad = tmp_path / "bad.npz"
    _rewrite_member(run_dir / "episodes" / "episode_00000.npz", bad, "chunks/noise.npy", _npy(header, payload))
    with pytest.raises(CorruptEpisode, match=match):
        read_npz(bad)


def test_npz_member_claiming_more_than_the_file_is_corrupt(run_dir, tmp_path):
    """A central directory claiming a deflated member expands past deflate's limit (a zip bomb) is refused unread."""
    bad = tmp_path / "bomb.npz"
    raw = bytearray((run_dir / "episodes" / "episode_00000.npz").read_bytes())
    central = raw.find(b"PK\x01\x02")
    raw[central + 10 : central + 12] = (8).to_bytes(2, "little")
    raw[central + 24 : central + 28] = (0xFFFFFFFE).to_bytes(4, "little")  # uncompressed size
    bad.write_bytes(bytes(raw))
    with pytest.raises(CorruptEpisode, match="bomb.npz: .*claims"):
        read_npz(bad)


def test_npz_of_another_episode_is_refused_where_the_index_is_known(run_dir):
    """episode_00001.npz holding episode 0: read_npz(expect_index=1) and load_any(run_dir) refuse it in one line."""
    eps = run_dir / "episodes"
    shutil.copyfile(eps / "episode_00000.npz", eps / "episode_00001.npz")
    with pytest.raises(CorruptEpisode, match=r"episode_00001.npz: holds episode 0, expected episode 1"):
        read_npz(eps / "episode_00001.npz", expect_index=1)
    with pytest.raises(CorruptEpisode, match=r"episode_00001.npz: holds episode 0, expected episode 1"):
        load_any(run_dir)
    assert read_npz(eps / "episode_00001.npz").index == 0  # a lone file names no index: read as it is
    res = _cli("inspect", str(run_dir))  # inspect lists every episode: this one is a BAD row naming why, exit 1
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert (
        "episode_00001.npz: holds episode 0, expected episode 1" in res.stdout
        and "1 episode(s) unreadable" in res.stdout
    )


def test_two_files_naming_one_episode_are_refused(run_dir):
    """episode_1.npz beside episode_00001.npz: one episode, two files, refused."""
    shutil.copyfile(run_dir / "episodes" / "episode_00001.npz", run_dir / "episodes" / "episode_1.npz")
    with pytest.raises(CorruptEpisode, match="names episode 1, as episode_00001.npz does"):
        load_any(run_dir)


def test_plot_dir_that_is_a_file_is_one_line(run_dir, tmp_path):
    """--plot naming a file, or a path under a file, is a ValueError naming it; nothing is written."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for bad, match in (
        (afile, "plot directory .*afile is a file"),
        (afile / "sub", "cannot be made: .*afile is a file"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            check_plot_dir(bad)
        assert "\n" not in str(info.value)
        with pytest.raises(ValueError, match=match):
            list(plot_episodes(load_any(run_dir), bad))
    assert afile.read_text() == "keep me"
    written = list(plot_episodes(load_any(run_dir), tmp_path / "plots"))
    assert [p.name for p in written] == ["episode_00000.png", "episode_00001.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["episode_00000.png", "episode_00001.png"]


def test_cli_inspect_plot_into_a_file_exits_2(run_dir, tmp_path):
    """``rollcap inspect RUN --plot FILE``: one line, exit 2, the file unchanged."""
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    _assert_one_line_exit_2(_cli("inspect", str(run_dir), "--plot", str(afile)), str(afile))
    assert afile.read_text() == "keep me"


def test_good_npz_still_reads_exactly(run_dir):
    """The size-checked reader returns what was written, writable arrays included."""
    back = read_npz(run_dir / "episodes" / "episode_00001.npz", expect_index=1)
    assert records_equal(back, synthetic_record(1, 8, steps=6, image_size=16)) is None
    assert all(a.flags.writeable for a in back.obs.values())


@pytest.mark.slow
def test_a_run_refused_at_set_up_leaves_no_directory_and_no_progress_bar(tmp_path):
    """`--execute-steps 9` on 8-action chunks is found once the policy is built: one line, exit 2, no run directory, no bar fragment; an existing empty --out stays empty."""
    proc = _cli("run", "--episodes", "2", "--execute-steps", "9", "--out", str(tmp_path / "new"))
    _assert_one_line_exit_2(proc, "--execute-steps")
    assert "ep/s" not in proc.stderr and not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    proc = _cli("run", "--episodes", "2", "--execute-steps", "9", "--out", str(tmp_path / "empty"))
    _assert_one_line_exit_2(proc, "--execute-steps")
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_plot_dir_that_cannot_be_made_is_refused_before_the_table(run_dir):
    """`rollcap inspect RUN --plot /proc/plots`: one line, exit 2, and no table first (it was printed, then refused)."""
    res = _cli("inspect", str(run_dir), "--plot", "/proc/plots")
    _assert_one_line_exit_2(res, "/proc/plots cannot be created")
    assert res.stdout == ""
