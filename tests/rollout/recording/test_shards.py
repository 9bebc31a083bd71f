"""Sharded runs without Ray: shards written as actors write them, read as one run, resumed, repaired, merged."""

from __future__ import annotations

import os

import pytest
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import (
    EpisodeRecorder,
    episode_digest,
    episodes_of,
    h5_indices,
    load_any,
    synthetic_record,
)
from rollcap.rollout.recording.journal import journal_path
from rollcap.rollout.recording.shards import (
    MANIFEST,
    ManifestWriter,
    is_sharded,
    merge,
    read_manifest,
)

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {"image_size": 8}}


def _rec(i: int):
    return synthetic_record(index=i, seed=100 + i, steps=6, image_size=8)


def _sharded(run_dir, layout: dict[str, list[int]], named=None) -> ManifestWriter:
    """Shards as actors write them (``layout``: shard name -> indices, in the order written); the manifest names ``named`` (default: all)."""
    m = ManifestWriter(run_dir, env_meta=ENV_META)
    for name, indices in layout.items():
        with EpisodeRecorder(run_dir / "shards" / name, env_meta=ENV_META) as rec:
            for i in indices:
                rec.write(_rec(i))
                if named is None or i in named:
                    m.add(i, episode_digest(_rec(i)), f"shards/{name}", node="n1")
    return m


def _digests(path) -> dict[int, str]:
    return {r.index: episode_digest(r) for r in load_any(path)}


WANT = {i: episode_digest(_rec(i)) for i in range(6)}


def test_a_sharded_run_reads_as_one_run_in_index_order_whatever_the_sharding(tmp_path):
    """1, 2 or 3 shards, episodes written out of order: load_any and episodes_of give the same episodes, by index."""
    for n, layout in enumerate(
        (
            {"s000": [0, 1, 2, 3, 4, 5]},
            {"s000": [1, 0, 4], "s001": [5, 2, 3]},
            {"s000": [2, 5], "s001": [0, 3], "s002": [4, 1]},
        )
    ):
        run = tmp_path / f"r{n}"
        _sharded(run, layout).close()
        assert is_sharded(run)
        assert _digests(run) == WANT and list(_digests(run)) == list(range(6))
        assert [r.index for _, r in episodes_of(run)] == list(range(6))


def test_merge_makes_the_single_file_layout_with_the_same_episodes(tmp_path):
    """rollcap merge: episodes/ and episodes.hdf5 in index order, same digests; the manifest and shards are gone; merging twice is refused."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [3, 0, 5], "s001": [1, 4, 2]}).close()
    assert merge(run) == 6
    assert not is_sharded(run) and not (run / "shards").exists()
    assert h5_indices(run / "episodes.hdf5") == list(range(6)) and _digests(run) == WANT
    with EpisodeRecorder(run, resume=True) as rec:
        assert [episode_digest(r) for r in rec.verify()] == [WANT[i] for i in range(6)]
    with pytest.raises(FileNotFoundError, match="not a sharded run"):
        merge(run)


def test_a_torn_manifest_line_is_ignored_and_its_episode_adopted_on_resume(tmp_path):
    """A crash mid-append leaves half a line: readers skip it; resume cuts it and names the episode from its shard, once."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1, 2]}, named={0, 1}).close()
    with open(run / MANIFEST, "ab") as fh:
        fh.write(b'{"digest": "ab')
    assert sorted(_digests(run)) == [0, 1]
    with ManifestWriter(run, env_meta=ENV_META, resume=True) as m:
        assert m.indices == [0, 1, 2]
        assert [episode_digest(r) for r in m.verify()] == [WANT[i] for i in range(3)]
    assert _digests(run) == {i: WANT[i] for i in range(3)}
    assert (run / MANIFEST).read_bytes().endswith(b"\n") and len(read_manifest(run)[1]) == 3


def _kill_inside_h5_append(h5) -> None:
    """What a SIGKILL inside an HDF5 append leaves: new bytes past the committed size, and the journal naming that size."""
    import struct
    import zlib

    size = h5.stat().st_size
    head = b"RCJHEAD1" + struct.pack("<Q", size)
    journal_path(h5).write_bytes(head + struct.pack("<I", zlib.crc32(head)))
    with open(h5, "ab") as fh:
        fh.write(os.urandom(5000))


def test_a_half_written_shard_is_ignored_by_readers_and_repaired_on_resume(tmp_path):
    """An actor killed inside episode 2's HDF5 append (npz written, a hot journal) after episode 1 whose answer never arrived:
    readers see the manifest's episode 0 only; resume rolls the shard back, copies 2 into its HDF5 and names 1 and 2, once."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1]}, named={0}).close()
    shard = run / "shards" / "s000"
    from rollcap.rollout.recording import write_npz

    write_npz(_rec(2), shard / "episodes" / "episode_00002.npz")
    _kill_inside_h5_append(shard / "episodes.hdf5")
    assert _digests(run) == {0: WANT[0]}
    assert h5_indices(shard / "episodes.hdf5") == [0, 1]  # read as of the last commit
    with ManifestWriter(run, env_meta=ENV_META, resume=True) as m:
        assert m.indices == [0, 1, 2]
        assert [episode_digest(r) for r in m.verify()] == [WANT[i] for i in range(3)]
    assert not journal_path(shard / "episodes.hdf5").exists() and h5_indices(shard / "episodes.hdf5") == [0, 1, 2]
    assert _digests(run) == {i: WANT[i] for i in range(3)}


def test_a_copy_of_an_episode_that_ran_again_elsewhere_is_removed_on_resume_not_copied_in(tmp_path):
    """A worker killed inside episode 2's HDF5 append (its npz written, a hot journal), episode 2 then run again and named
    in another shard: resume removes the npz copy instead of copying it into the first shard's HDF5, so every episode is
    in exactly one shard, in both formats."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1], "s001": [2, 3]}).close()
    shard = run / "shards" / "s000"
    from rollcap.rollout.recording import write_npz

    write_npz(_rec(2), shard / "episodes" / "episode_00002.npz")
    _kill_inside_h5_append(shard / "episodes.hdf5")
    with ManifestWriter(run, env_meta=ENV_META, resume=True) as m:
        assert m.indices == [0, 1, 2, 3] and m.entries[2].shard == "shards/s001"
    assert sorted(p.name for p in (shard / "episodes").iterdir()) == ["episode_00000.npz", "episode_00001.npz"]
    assert h5_indices(shard / "episodes.hdf5") == [0, 1] and not journal_path(shard / "episodes.hdf5").exists()
    assert _digests(run) == {i: WANT[i] for i in range(4)}


def test_a_stray_file_in_a_shard_is_refused_on_resume_not_adopted(tmp_path):
    """An npz named for episode 2 that holds episode 1: resume raises CorruptEpisode naming it, and names nothing."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1]}).close()
    eps = run / "shards" / "s000" / "episodes"
    (eps / "episode_00002.npz").write_bytes((eps / "episode_00001.npz").read_bytes())
    with pytest.raises(CorruptEpisode, match="episode_00002"):
        ManifestWriter(run, env_meta=ENV_META, resume=True)
    assert sorted(read_manifest(run)[1]) == [0, 1]


def test_a_shard_that_lost_an_episode_the_manifest_names_is_one_corrupt_episode(tmp_path):
    """The manifest names an episode its shard does not hold (or holds other bytes): load_any raises naming it; episodes_of reports it and reads on."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1], "s001": [2]}).close()
    os.unlink(run / "shards" / "s000" / "episodes" / "episode_00001.npz")
    with pytest.raises(CorruptEpisode, match="episode 1"):
        load_any(run)
    got = episodes_of(run)
    assert [type(r).__name__ for _, r in got] == ["EpisodeRecord", "CorruptEpisode", "EpisodeRecord"]


def test_a_manifest_naming_an_episode_twice_or_without_header_is_refused(tmp_path):
    """Exactly once: a second line for an index is CorruptEpisode, and ManifestWriter.add refuses it; no header: CorruptEpisode."""
    run = tmp_path / "run"
    m = _sharded(run, {"s000": [0]})
    with pytest.raises(ValueError, match="already recorded"):
        m.add(0, WANT[0], "shards/s001")
    m.close()
    with open(run / MANIFEST, "ab") as fh:
        fh.write(open(run / MANIFEST, "rb").read().splitlines(keepends=True)[1])
    with pytest.raises(CorruptEpisode, match="again"):
        load_any(run)
    (run / MANIFEST).write_text("{}\n")
    with pytest.raises(CorruptEpisode, match="header"):
        load_any(run)
