"""The recorder in a child process: the same episodes on disk, failures surface on the host thread, resume, abandon."""

from __future__ import annotations

import numpy as np
import pytest

from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.recording import EpisodeRecorder, read_h5, read_npz, records_equal, synthetic_record
from rollcap.rollout.recording.process import WriterProcess, decode, encode

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


def end(record) -> EpisodeEnd:
    return EpisodeEnd(
        record.index,
        record.seed,
        record.stop_reason,
        record.success,
        record.num_steps,
        record.num_chunks,
        record=record,
    )


def test_encode_round_trips_every_field_byte_for_byte():
    """A record crosses the pipe as bytes (no pickle) and comes back equal: dtypes, byte order, 0-d and empty arrays."""
    rec = synthetic_record(3, seed=3, steps=20, image_size=16)
    rec.initial_state["be"] = np.arange(3, dtype=">f8")
    rec.obs["fortran"] = np.asfortranarray(np.arange(40, dtype=np.int32).reshape(20, 2))
    assert records_equal(decode(encode(rec)), rec) is None
    empty = synthetic_record(0, steps=0, image_size=8)
    assert records_equal(decode(encode(empty)), empty) is None


@pytest.mark.slow(seconds=20)
def test_writer_process_writes_what_a_recorder_writes(tmp_path):
    """Episodes sent to the child are on disk in both formats, equal to what was sent; resume reports the indices."""
    recs = [synthetic_record(i, seed=i, steps=(0, 9, 16)[i % 3], image_size=16) for i in range(5)]
    writer = WriterProcess(tmp_path / "run", env_meta=ENV_META, max_pending=2)
    assert writer.next_index == 0
    for r in recs:
        writer.on_episode_end(end(r))
    writer.on_episode_end(EpisodeEnd(9, 9, "caller", False, 0, 0, dropped=True))  # no record: nothing sent
    writer.on_run_end()
    assert writer.discarded == [] and writer.writer_cpu_s > 0
    got = read_h5(tmp_path / "run" / "episodes.hdf5")
    assert [records_equal(a, b) for a, b in zip(got, recs)] == [None] * 5
    rec = EpisodeRecorder(tmp_path / "run", resume=True)
    assert all(records_equal(read_npz(rec.npz_path(r.index)), r) is None for r in recs)
    again = WriterProcess(tmp_path / "run", env_meta=ENV_META, resume=True)
    assert again.next_index == 5
    again.on_episode_end(end(recs[0]))  # already recorded: refused in the child, raised here
    with pytest.raises(RecordingFailed, match="episode 0 is already recorded"):
        again.flush()
    again.close()
    with pytest.raises(RecordingFailed, match="already holds episodes"):
        WriterProcess(tmp_path / "run", env_meta=ENV_META)


@pytest.mark.slow(seconds=8)
def test_abandon_drops_what_waits(tmp_path):
    """After abandon() the child writes nothing more; the dropped indices are reported."""
    writer = WriterProcess(tmp_path / "run", env_meta=ENV_META)
    writer.abandon()
    for i in range(3):
        writer.on_episode_end(end(synthetic_record(i, seed=i, steps=4, image_size=8)))
    writer.close()
    assert writer.discarded == [0, 1, 2]
    assert EpisodeRecorder(tmp_path / "run", resume=True).indices == []


@pytest.mark.slow(seconds=20)
def test_writer_pool_records_one_sharded_run(tmp_path):
    """Two writer processes record their own shards; the manifest names every episode; readers see one run in index order."""
    from rollcap.rollout.recording import load_any
    from rollcap.rollout.recording.process import WriterPool

    recs = [synthetic_record(i, seed=i, steps=(0, 9, 16)[i % 3], image_size=16) for i in range(6)]
    pool = WriterPool(tmp_path / "run", writers=2, env_meta=ENV_META, max_pending=1)
    for r in recs:
        pool.on_episode_end(end(r))
    pool.on_run_end()
    assert pool.manifest.indices == list(range(6)) and pool.writer_cpu_s > 0
    shards = {e.shard for e in pool.manifest.entries.values()}
    assert shards == {"shards/s000", "shards/s001"}
    assert [records_equal(a, b) for a, b in zip(load_any(tmp_path / "run"), recs)] == [None] * 6
