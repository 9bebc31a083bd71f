"""HDF5 for robomimic: next_obs and filter masks as its SequenceDataset reads them, crash safety, bounded reads."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import h5py
import numpy as np
import pytest

from rollcap.rollout.episode import ACTOR_POLICY
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import (
    EpisodeRecorder,
    H5Writer,
    episode_digest,
    pending_journal,
    read_h5,
    read_h5_episode,
    records_equal,
    recover_h5,
    synthetic_record,
)
from rollcap.rollout.recording.h5 import MASKS, demo_split
from rollcap.rollout.recording.journal import committed_view
from tests.rollout.recording.test_recording import (
    ENV_META,
    _fork,
    _io_hook,
    h5_demo_meta,
    small,
    two_demos_and_append_io_count,
)


def policy_only(record):
    """``record`` with every step chosen by the policy (no intervention)."""
    return replace(record, steps={**record.steps, "actor": np.full(record.num_steps, ACTOR_POLICY, np.uint8)})


def mixed() -> list:
    """Successes and failures, with and without interventions, a 0-step and a 1-step episode."""
    return [
        synthetic_record(0, 5, steps=0),
        synthetic_record(1, 6, steps=1, horizon=4, image_size=16),
        synthetic_record(2, 7, steps=13, image_size=16),
        policy_only(synthetic_record(3, 8, steps=9, horizon=4, image_size=16)),
        policy_only(synthetic_record(4, 9, steps=16, image_size=16)),
        synthetic_record(11, 10, steps=7, horizon=4, image_size=16),
    ]


def expected_masks(records) -> dict[str, list[str]]:
    """The filter keys robomimic should see for ``records``, demo names sorted by index."""
    want: dict[str, list[str]] = {k: [] for k in MASKS}
    for r in sorted(records, key=lambda r: r.index):
        name = f"demo_{r.index}"
        want["success" if r.success else "failure"].append(name)
        if np.any(r.steps["actor"] != ACTOR_POLICY):
            want["intervened"].append(name)
        if r.num_steps:
            want[demo_split(r.index)].append(name)
    return want


def robomimic_demos(f: h5py.File, filter_key: str | None) -> list[str]:
    """The demo list as robomimic's SequenceDataset.load_demo_info builds it: mask or all, sorted by int index."""
    if filter_key is None:
        demos = list(f["data"].keys())
    else:
        demos = [elem.decode("utf-8") for elem in np.array(f[f"mask/{filter_key}"][:])]
    return [demos[i] for i in np.argsort([int(elem[5:]) for elem in demos])]


def check_robomimic_view(f: h5py.File, records) -> None:
    """Read ``f`` the way SequenceDataset(load_next_obs=True) does and compare with ``records``."""
    by_name = {f"demo_{r.index}": r for r in records}
    assert json.loads(f["data"].attrs["env_args"]) == ENV_META
    want = expected_masks(records)
    for key in MASKS:
        assert robomimic_demos(f, key) == want[key], key
    demos = robomimic_demos(f, None)
    assert demos == sorted(by_name, key=lambda n: int(n[5:]))
    for ep in demos:
        r, n = by_name[ep], int(f[f"data/{ep}"].attrs["num_samples"])
        assert n == r.num_steps
        for k in ("actions", "rewards", "dones"):  # robomimic's default dataset_keys, read and cast as it does
            got = f[f"data/{ep}/{k}"][()].astype("float32")
            assert np.array_equal(got, r.steps[k].astype("float32"))
        for k, obs in r.obs.items():
            nxt = f[f"data/{ep}/next_obs/{k}"]
            assert np.array_equal(f[f"data/{ep}/obs/{k}"][()], obs)
            last = r.final_obs.get(k)
            if last is None or last.shape != obs.shape[1:]:
                last = obs[-1:]  # no final frame of this key: the last observation again
            want_next = np.concatenate([obs[1:], last.reshape(1, *obs.shape[1:])]) if n else obs
            assert nxt.shape == obs.shape and nxt.dtype == obs.dtype
            assert np.array_equal(nxt[()], want_next)
            for t in range(n):  # get_sequence_from_demo: data[begin:end] around each index (frame stack 1, seq 3)
                begin, end = max(0, t - 1), min(n, t + 3)
                assert np.array_equal(nxt[begin:end], want_next[begin:end])
            if n:
                assert np.array_equal(nxt[n - 1], last.reshape(obs.shape[1:]))


def test_robomimic_reads_next_obs_and_masks(tmp_path):
    """SequenceDataset's access pattern (swmr, libver latest, masks, per-demo slices) sees next_obs and masks."""
    records = mixed()
    rec = EpisodeRecorder(tmp_path / "run", env_meta=ENV_META)
    for r in records:
        rec.write(r)
    rec.close()
    path = tmp_path / "run" / "episodes.hdf5"
    with h5py.File(path, "r", swmr=True, libver="latest") as f:
        check_robomimic_view(f, records)
    assert_same_records(read_h5(path), records)


def assert_same_records(got, want) -> None:
    assert [r.index for r in got] == [r.index for r in want]
    for g, w in zip(got, want):
        assert records_equal(g, w) is None, records_equal(g, w)


def test_next_obs_is_a_view_that_survives_copy_and_rename(tmp_path):
    """next_obs stores no image bytes (virtual, source file '.'), and a copied, renamed file still reads."""
    records = mixed()
    path = tmp_path / "a.hdf5"
    with H5Writer(path, ENV_META) as w:
        for r in records:
            w.append(r)
    with h5py.File(path, "r") as f:
        nxt = f["data/demo_2/next_obs/agentview_image"]
        assert nxt.is_virtual and {m.file_name for m in nxt.virtual_sources()} == {"."}
        assert {m.dset_name for m in nxt.virtual_sources()} == {
            "/data/demo_2/obs/agentview_image",
            "/data/demo_2/rollcap/final_obs/agentview_image",
        }
        assert h5_demo_meta(f, 2)["digest"] == episode_digest(records[2])  # the digest is unchanged
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(path, other / "copy.hdf5")
    path.rename(tmp_path / "renamed.hdf5")
    for p in (other / "copy.hdf5", tmp_path / "renamed.hdf5"):
        with h5py.File(p, "r", swmr=True, libver="latest") as f:
            check_robomimic_view(f, records)
        assert_same_records(read_h5(p), records)


def test_old_files_read_and_gain_next_obs_and_masks_on_resume(tmp_path):
    """A file without next_obs / mask reads the same records; the next append derives both for every demo."""
    records = mixed()
    path = tmp_path / "old.hdf5"
    with H5Writer(path, ENV_META) as w:
        for r in records[:4]:
            w.append(r)
    with h5py.File(path, "r+") as f:  # what rollcap wrote before next_obs and masks
        del f["mask"]
        for r in records[:4]:
            del f[f"data/demo_{r.index}/next_obs"]
    assert_same_records(read_h5(path), records[:4])
    with H5Writer(path, resume=True) as w:
        for r in records[4:]:
            w.append(r)
    with h5py.File(path, "r", swmr=True, libver="latest") as f:
        check_robomimic_view(f, records)
    assert_same_records(read_h5(path), records)


def test_split_is_deterministic_and_about_nine_to_one():
    """train / valid depend on the index alone, about 10% valid."""
    splits = [demo_split(i) for i in range(2000)]
    assert splits == [demo_split(i) for i in range(2000)]
    assert 0.07 < splits.count("valid") / len(splits) < 0.13


def _masks_and_demos(f: h5py.File) -> tuple[dict[str, list[str]], list[str]]:
    masks = {k: [n.decode() for n in f[f"mask/{k}"][()]] for k in MASKS} if "mask" in f else {}
    return masks, sorted(f["data"], key=lambda n: int(n[5:]))


@pytest.mark.slow
def test_crash_mid_append_leaves_masks_and_demos_agreeing(tmp_path, monkeypatch):
    """SIGKILL at I/O points of an append: before and after recovery, every mask names exactly the demos present."""
    base, n = two_demos_and_append_io_count(tmp_path, monkeypatch)
    path, seen = tmp_path / "e.hdf5", set()
    for k in range(1, n + 1):
        shutil.copy(base, path)
        pid = _fork(lambda: (_io_hook(k, k % 2 == 0, [0]), H5Writer(path, resume=True).append(small(2))))
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), (k, status)
        with committed_view(path) as view, h5py.File(view, "r") as f:  # what rollcap's readers see
            masks, demos = _masks_and_demos(f)
        want = [small(int(d[5:])) for d in demos]
        assert masks == expected_masks(want) and len(demos) in (2, 3)
        seen.add((len(demos), pending_journal(path)))
        recover_h5(path)
        with h5py.File(path, "r", swmr=True, libver="latest") as f:  # what robomimic sees after recovery
            assert _masks_and_demos(f) == (masks, demos)
            check_robomimic_view(f, want)
    assert {(2, True), (3, False)} <= seen  # kills landed both before and after the commit point


@pytest.mark.parametrize(
    "where, chunked",
    [
        ("rollcap/fields", False),  # no row count to check: the stored bytes bound it
        ("rollcap/fields", True),
        ("obs/proprio", True),  # a per-step table: num_samples bounds it first
        ("rollcap/final_obs/proprio", False),
    ],
)
def test_huge_declared_dataset_is_corrupt_not_memory_error(where, chunked, tmp_path):
    """A dataset declaring 10^12 unwritten elements: CorruptEpisode naming file and dataset, nothing allocated."""
    path = tmp_path / "e.hdf5"
    with H5Writer(path, ENV_META) as w:
        w.append(synthetic_record(1, 3, steps=6, horizon=4, image_size=16))
    with h5py.File(path, "r+") as f:
        demo = f["data/demo_1"]
        del demo[where]
        kw = {"chunks": (4096,), "maxshape": (None,), "compression": "gzip"} if chunked else {}
        demo.create_dataset(where, shape=(10**12,), dtype="f8", **kw)
    with pytest.raises(CorruptEpisode) as err:
        read_h5_episode(path, 1)
    msg = str(err.value)
    assert msg.startswith(f"{path}: ") and f"data/demo_1/{where}" in msg and "\n" not in msg
