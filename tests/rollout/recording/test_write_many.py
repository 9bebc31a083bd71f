"""Several episodes in one commit: the same files as one at a time, all or none, and the background writer batches what waits."""

from __future__ import annotations

import threading

import h5py
import numpy as np
import pytest

from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.recording import h5 as record_h5
from rollcap.rollout.recording import (
    EpisodeRecorder,
    pending_journal,
    read_h5,
    read_npz,
    records_equal,
    synthetic_record,
)
from rollcap.rollout.subscribers import InBackground

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


def records(n: int = 4) -> list:
    return [synthetic_record(i, seed=i, steps=(0, 9, 16, 20)[i % 4], image_size=16) for i in range(n)]


def _masks(path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: sorted(f["mask"][k][()].tolist()) for k in f["mask"]}


def test_write_many_equals_one_at_a_time(tmp_path):
    """A batch gives the same episodes, masks and totals as writing them one by one (first append included)."""
    recs = records()
    one = EpisodeRecorder(tmp_path / "one", env_meta=ENV_META)
    for r in recs:
        one.write(r)
    many = EpisodeRecorder(tmp_path / "many", env_meta=ENV_META)
    many.write_many(recs[:3])
    many.write_many(recs[3:])
    for rec in (one, many):
        rec.close()
    got = read_h5(tmp_path / "many" / "episodes.hdf5")
    assert [records_equal(a, b) for a, b in zip(got, recs)] == [None] * len(recs)
    assert all(records_equal(read_npz(many.npz_path(r.index)), r) is None for r in recs)
    assert _masks(tmp_path / "one" / "episodes.hdf5") == _masks(tmp_path / "many" / "episodes.hdf5")
    with h5py.File(tmp_path / "many" / "episodes.hdf5", "r") as f:
        assert int(f["data"].attrs["total"]) == sum(r.num_steps for r in recs)


def test_write_many_is_all_or_none(tmp_path, monkeypatch):
    """A failure inside a batch's HDF5 commit leaves none of its episodes in either format; a repeated index is refused first."""
    recs = records()
    rec = EpisodeRecorder(tmp_path / "run", env_meta=ENV_META)
    rec.write(recs[0])
    with pytest.raises(ValueError, match="episode 0 is already recorded"):
        rec.write_many([recs[1], recs[0]])
    real_put, calls = record_h5._put, [0]

    def failing_put(group, name, a, file=None):
        calls[0] += 1
        if calls[0] == 14:  # inside the batch's second demo (ten datasets a demo)
            raise OSError("disk full")
        real_put(group, name, a, file)

    monkeypatch.setattr(record_h5, "_put", failing_put)
    with pytest.raises(OSError, match="disk full"):
        rec.write_many(recs[1:])
    monkeypatch.setattr(record_h5, "_put", real_put)
    assert rec.indices == [0] and not pending_journal(rec.h5_path)
    assert sorted(p.name for p in rec.episodes_dir.iterdir()) == ["episode_00000.npz"]
    rec.write_many(recs[1:])
    rec.close()
    assert [r.index for r in read_h5(rec.h5_path)] == [0, 1, 2, 3]


class _Gate(EpisodeRecorder):
    """A recorder whose first write waits for a gate, so later episodes queue up behind it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate, self.calls = threading.Event(), []

    def write_many(self, recs):
        self.gate.wait(10)
        self.calls.append([r.index for r in recs])
        super().write_many(recs)


def test_background_writer_hands_over_what_waits_in_one_call(tmp_path):
    """Episodes queued behind a slow write go to on_episode_ends together, in order; every one is written."""
    recs = records(6)
    inner = _Gate(tmp_path / "run", env_meta=ENV_META)
    bg = InBackground(inner, max_pending=8)
    for r in recs:
        bg.on_episode_end(EpisodeEnd(r.index, r.seed, r.stop_reason, r.success, r.num_steps, r.num_chunks, record=r))
    inner.gate.set()
    bg.on_run_end()
    assert [i for call in inner.calls for i in call] == list(range(6))
    assert any(len(call) > 1 for call in inner.calls)
    assert [r.index for r in read_h5(inner.h5_path)] == list(range(6))
    assert np.array_equal(read_npz(inner.npz_path(5)).obs["wrist_image"], recs[5].obs["wrist_image"])
