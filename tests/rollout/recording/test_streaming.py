"""Streaming loaders: iter_any / iter_episodes read a run one episode at a time, in load_any's order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollcap.rollout.offline.inspect import episode_table
from rollcap.rollout.recording import iter_any, load_any
from rollcap.rollout.recording import EpisodeRecorder, records_equal, synthetic_record
from rollcap.rollout.recording import episodes_of, iter_episodes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory of 4 small synthetic episodes, written out of order, in both formats."""
    d = tmp_path_factory.mktemp("stream")
    with EpisodeRecorder(d, env_meta={"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}) as rec:
        for i in (2, 0, 3, 1):
            rec.write(synthetic_record(i, i, steps=6, image_size=8))
    return d


@pytest.mark.parametrize("where", ["", "episodes", "episodes.hdf5"])
def test_iter_any_streams_what_load_any_returns(run_dir, where):
    """Lazy (an iterator, nothing read before next()), same records in the same order as load_any."""
    it = iter_any(run_dir / where)
    assert isinstance(it, Iterator)
    streamed, loaded = list(it), load_any(run_dir / where)
    assert [r.index for r in streamed] == [0, 1, 2, 3]
    assert all(records_equal(a, b) is None for a, b in zip(streamed, loaded, strict=True))


def test_iter_episodes_matches_episodes_of(run_dir):
    """Replay's streaming reader yields episodes_of's (source, record) pairs one by one."""
    it = iter_episodes(run_dir / "episodes.hdf5")
    assert isinstance(it, Iterator)
    first = next(it)
    assert first[0].endswith("demo_0") and first[1].index == 0
    assert [(s, r.index) for s, r in [first, *it]] == [(s, r.index) for s, r in episodes_of(run_dir / "episodes.hdf5")]


def test_streaming_errors_arrive_on_first_next(tmp_path):
    """A missing path raises FileNotFoundError once iterated (load_any raises it at once, as before)."""
    it = iter_any(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        next(it)
    with pytest.raises(FileNotFoundError):
        load_any(tmp_path / "nope")


def test_episode_table_goes_through_an_iterator_once(run_dir):
    """The table's totals come from the single pass (an exhausted iterator would give 0 otherwise)."""
    table = episode_table(iter_any(run_dir))
    assert table.splitlines()[-1].startswith("4 episode(s)") and table == episode_table(load_any(run_dir))
