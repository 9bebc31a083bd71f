"""Recording: npz / HDF5 round trips, robomimic layout, resume, crash safety, corrupt input."""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import io
import json
import os
import random
import shutil
import signal
import time
import zipfile
from dataclasses import replace

import h5py
import numpy as np
import pytest

from rollcap.kernels.files import canonical_json
from rollcap.rollout.episode import ACTOR_HUMAN, FORMAT_VERSION
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import h5 as record_h5
from rollcap.rollout.recording import (
    EpisodeRecorder,
    H5Writer,
    episode_digest,
    journal_path,
    pending_journal,
    measure_write_overhead,
    read_h5,
    read_h5_episode,
    read_npz,
    records_equal,
    recover_h5,
    synthetic_record,
    write_npz,
)
from rollcap.rollout.recording.codec import is_image, scalar_meta, timings_digest
from rollcap.rollout.recording.h5 import IMAGE_CODEC
from rollcap.rollout.recording.npz import DEFLATE_MIN

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {"image_size": 64}}
FORMATS = ("npz", "h5")


def episodes() -> list:
    """A 0-step episode (stopped at the first chunk), a terminated one, a timeout-at-boundary one."""
    return [synthetic_record(0, 11, steps=0), synthetic_record(1, 12, steps=13), synthetic_record(2, 2**70, steps=16)]


def small(index: int) -> object:
    """A small episode with 16x16 images, for crash loops."""
    return synthetic_record(index, 100 + index, steps=6, horizon=4, image_size=16)


def write_all(fmt: str, records, tmp_path):
    """Write ``records`` in ``fmt``; return the path(s) and a reader of every episode."""
    if fmt == "npz":
        paths = [tmp_path / f"episode_{r.index:05d}.npz" for r in records]
        for r, p in zip(records, paths):
            write_npz(r, p)
        return paths[0], lambda: [read_npz(p) for p in paths]
    path = tmp_path / "episodes.hdf5"
    with H5Writer(path, ENV_META) as w:
        for r in records:
            w.append(r)
    return path, lambda: read_h5(path)


def assert_same(got, want) -> None:
    assert [r.index for r in got] == [r.index for r in want]
    for g, w in zip(got, want):
        assert records_equal(g, w) is None, records_equal(g, w)


# --------------------------------------------------------------------------- round trips and layout


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_is_byte_exact(fmt, tmp_path):
    """Every field (images, NaN latencies, uint64 RNG, 0-d state, 0-step episode, big seed) comes back bit for bit."""
    records = episodes()
    assert records[1].steps["actor"].tolist().count(ACTOR_HUMAN) > 0
    _, read = write_all(fmt, records, tmp_path)
    assert_same(read(), records)


def test_npz_loads_without_pickle(tmp_path):
    """The npz is plain arrays: np.load(allow_pickle=False) reads every key, meta.json parses, images deflated."""
    rec = episodes()[1]
    write_npz(rec, tmp_path / "e.npz")
    with np.load(tmp_path / "e.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert all(a.dtype != object for a in arrays.values())
    meta = json.loads(bytes(arrays["meta.json"]).decode())
    assert meta["format_version"] == FORMAT_VERSION and meta["codec"] == "deflate-1"
    assert (meta["num_steps"], meta["num_chunks"], meta["seed"]) == (13, 2, 12)
    assert np.array_equal(arrays["obs/agentview_image"], rec.obs["agentview_image"])
    assert {k.split("/")[0] for k in arrays} == {"meta.json", "initial_state", "obs", "final_obs", "steps", "chunks"}
    with zipfile.ZipFile(tmp_path / "e.npz") as zf:  # images and arrays of DEFLATE_MIN bytes or more deflated
        for i in zf.infolist():
            big = is_image(arrays[i.filename[:-4]]) or arrays[i.filename[:-4]].nbytes >= DEFLATE_MIN
            assert i.compress_type == (zipfile.ZIP_DEFLATED if big else zipfile.ZIP_STORED), i.filename
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED}
    no_images = replace(rec, obs={"proprio": rec.obs["proprio"]}, final_obs={})
    write_npz(no_images, tmp_path / "s.npz")
    with zipfile.ZipFile(tmp_path / "s.npz") as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    assert records_equal(read_npz(tmp_path / "s.npz"), no_images) is None


def test_h5_layout_is_robomimic(tmp_path):
    """data/demo_N/{actions,rewards,dones,states,obs/*}, num_samples, total, env_args JSON; extras under rollcap/."""
    records = episodes()
    path, _ = write_all("h5", records, tmp_path)
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert json.loads(data.attrs["env_args"]) == ENV_META
        assert sorted(data) == ["demo_0", "demo_1", "demo_2"]
        assert int(data.attrs["total"]) == sum(r.num_steps for r in records) == 29
        for r in records:
            demo = data[f"demo_{r.index}"]
            assert int(demo.attrs["num_samples"]) == r.num_steps
            assert {"actions", "rewards", "dones", "states", "obs", "rollcap"} <= set(demo)
            for k in ("actions", "rewards", "dones", "states"):
                assert np.array_equal(demo[k][()], r.steps[k])
            assert sorted(demo["obs"]) == sorted(r.obs)
            img = demo["obs/agentview_image"]
            assert (img.chunks, img.compression, img.compression_opts) == (
                (min(10, max(r.num_steps, 1)), 64, 64, 3),
                "gzip",
                4,
            )
            rc = demo["rollcap"]
            assert sorted(rc) == ["fields", "final_obs"]
            for k, a in r.final_obs.items():
                assert np.array_equal(rc["final_obs"][k][()], a)
            with np.load(io.BytesIO(rc["fields"][()].tobytes()), allow_pickle=False) as z:  # a plain npz, stored
                fields = {k: z[k] for k in z.files}
            assert sorted(fields) == sorted(
                ["meta.json", *(f"initial_state/{k}" for k in r.initial_state), *(f"chunks/{k}" for k in r.chunks)]
                + [f"steps/{k}" for k in ("actor", "terminated", "truncated")]
            )
            meta = json.loads(bytes(fields["meta.json"]).decode())
            assert meta["instruction"] == r.instruction and meta["success"] == r.success
            assert meta["format_version"] == FORMAT_VERSION and meta["seed"] == r.seed
            assert meta["config"] == r.config and meta["codec"] == IMAGE_CODEC
            for k, a in r.chunks.items():
                assert fields[f"chunks/{k}"].tobytes() == a.tobytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_error_is_stored_only_when_set(fmt, tmp_path):
    """An episode's error round-trips and is digested; without one, no 'error' key is written at all."""
    plain, failed = (
        synthetic_record(0, 3, steps=5),
        replace(synthetic_record(1, 3, steps=5), error="RuntimeError: boom \u2192 x"),
    )
    assert episode_digest(plain) != episode_digest(replace(plain, error="x"))
    _, read = write_all(fmt, [plain, failed], tmp_path)
    got = read()
    assert_same(got, [plain, failed])
    assert [r.error for r in got] == [None, failed.error]
    assert records_equal(got[1], replace(failed, error="other")).startswith("error")
    if fmt == "npz":
        metas = []
        for i in (0, 1):
            with np.load(tmp_path / f"episode_{i:05d}.npz", allow_pickle=False) as z:
                metas.append(json.loads(bytes(z["meta.json"]).decode()))
    else:
        with h5py.File(tmp_path / "episodes.hdf5", "r") as f:
            metas = [h5_demo_meta(f, i) for i in (0, 1)]
    assert "error" not in metas[0] and metas[1]["error"] == failed.error
    with pytest.raises(ValueError, match="error is int"):
        write_npz(replace(plain, error=3), tmp_path / "bad.npz")


def test_h5_writer_refuses_clobber_and_duplicates(tmp_path):
    """An existing file needs resume=True; a duplicate index is refused and leaves the file byte-identical."""
    path, _ = write_all("h5", episodes()[:2], tmp_path)
    with pytest.raises(FileExistsError, match="resume=True"):
        H5Writer(path, ENV_META)
    with pytest.raises(
        ValueError, match="recorded with env_id PushBlock-v0; `resume=True` needs the same, got Other-v0"
    ):
        H5Writer(path, {**ENV_META, "env_name": "Other-v0"}, resume=True)
    before = path.read_bytes()
    w = H5Writer(path, resume=True)
    assert w.indices == [0, 1] and w.env_meta == ENV_META
    with pytest.raises(ValueError, match="demo_1 exists"):
        w.append(episodes()[1])
    w.close()
    with pytest.raises(RuntimeError, match="after close"):
        w.append(episodes()[2])
    assert path.read_bytes() == before
    with pytest.raises(KeyError, match="no demo_7"):
        read_h5_episode(path, 7)


def test_unrecordable_records_are_refused(tmp_path):
    """A '/' in a key, an object array or a non-JSON config is a ValueError before anything is written."""
    rec = episodes()[1]
    bad = [
        replace(rec, obs={**rec.obs, "a/b": rec.obs["proprio"]}),
        replace(rec, initial_state={"x": np.array(["s"], dtype=object)}),
        replace(rec, config={"f": object()}),
    ]
    for b in bad:
        with pytest.raises(ValueError):
            write_npz(b, tmp_path / "x.npz")
    assert not list(tmp_path.iterdir())


def test_records_equal_names_first_difference():
    """records_equal: None when identical, else the first differing field (NaN equals itself, -0.0 != 0.0)."""
    a, b = synthetic_record(1, 5, steps=9), synthetic_record(1, 5, steps=9)
    assert records_equal(a, b) is None
    b.obs["wrist_image"][4, 2, 1, 0] ^= 1
    assert records_equal(a, b).startswith("obs['wrist_image']: bytes differ, first at (4, 2, 1, 0)")
    assert records_equal(a, replace(a, instruction="x")).startswith("instruction")
    c = synthetic_record(1, 5, steps=9)
    c.chunks["critic_value"][0] = -0.0
    a.chunks["critic_value"][0] = 0.0
    assert records_equal(a, c).startswith("chunks['critic_value']")
    assert records_equal(a, replace(a, env_kwargs={**a.env_kwargs, "cameras": ("front", "wrist")})) is None


def test_write_overhead_is_measured():
    """measure_write_overhead returns seconds per recorded episode."""
    s = measure_write_overhead(synthetic_record(steps=8, image_size=16), episodes=2)
    assert 0 < s < 5


# --------------------------------------------------------------------------- the recorder and resume


def test_recorder_writes_both_formats_and_resumes(tmp_path):
    """Episodes land in npz and HDF5; resume reports next_index and keeps earlier episodes intact."""
    run = tmp_path / "run"
    with EpisodeRecorder(run, env_meta=ENV_META) as rec:
        assert rec.next_index == 0
        for r in episodes()[:2]:
            rec.write(r)
        with pytest.raises(ValueError, match="already recorded"):
            rec.write(episodes()[1])
    before = (run / "episodes.hdf5").read_bytes()
    with pytest.raises(FileExistsError, match="resume=True"):
        EpisodeRecorder(run, env_meta=ENV_META)
    assert (run / "episodes.hdf5").read_bytes() == before
    rec = EpisodeRecorder(run, env_meta=ENV_META, resume=True)
    assert rec.next_index == 2 and rec.indices == [0, 1]
    rec.write(episodes()[2])
    rec.on_run_end()
    assert sorted(p.name for p in (run / "episodes").iterdir()) == [f"episode_0000{i}.npz" for i in range(3)]
    assert_same(read_h5(run / "episodes.hdf5"), episodes())
    assert_same([read_npz(rec.npz_path(i)) for i in range(3)], episodes())


def test_resume_repairs_an_episode_missing_from_one_format(tmp_path):
    """A crash between the npz and the HDF5 write is repaired on resume, both ways."""
    run = tmp_path / "run"
    with EpisodeRecorder(run, formats=("npz",)) as rec:  # an npz-only run, later recorded in both
        for r in episodes()[:2]:
            rec.write(r)
    rec = EpisodeRecorder(run, resume=True)
    assert_same(read_h5(run / "episodes.hdf5"), episodes()[:2])
    with h5py.File(run / "episodes.hdf5", "r") as f:
        assert json.loads(f["data"].attrs["env_args"])["env_name"] == "PushBlock-v0"
    rec.close()
    rec.npz_path(1).unlink()
    (run / "episodes" / ".episode_00002.npz.x.tmp").write_bytes(b"half")  # a crash's stray temp file
    rec = EpisodeRecorder(run, resume=True)
    assert rec.next_index == 2 and not list((run / "episodes").glob(".*.tmp"))
    assert records_equal(read_npz(rec.npz_path(1)), episodes()[1]) is None


# --------------------------------------------------------------------------- crash safety


def _fork(fn) -> int:
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            fn()
        except KeyboardInterrupt:
            code = 130
        except BaseException:
            code = 1
        os._exit(code)
    return pid


IO_CALLS = ("pwrite", "pwritev", "ftruncate", "fsync", "unlink")
"""The calls that change a file: a kill test stops the writer before (or halfway through) each."""


def _io_hook(kill_at: int, torn: bool, counter: list) -> None:
    """Patch os so the ``kill_at``-th write / truncate / fsync / unlink SIGKILLs the process (a torn write first)."""
    real_pwrite = os.pwrite
    for name in IO_CALLS:
        real = getattr(os, name)

        def hooked(*args, _real=real, _name=name):
            counter[0] += 1
            if counter[0] == kill_at:
                if torn and _name in ("pwrite", "pwritev"):
                    first = memoryview(args[1] if _name == "pwrite" else args[1][0]).cast("B")
                    real_pwrite(args[0], first[: len(first) // 2], args[2])
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*args)

        setattr(os, name, hooked)


def two_demos(tmp_path):
    """``base.hdf5``: demos 0 and 1, the writer closed."""
    base = tmp_path / "base.hdf5"
    with H5Writer(base, ENV_META) as w:
        for i in range(2):
            w.append(small(i))
    return base


def _count_io(m: pytest.MonkeyPatch, counter: list) -> None:
    """Count the I/O calls of :data:`IO_CALLS` in ``counter[0]`` (through ``m``, undone with it)."""
    for name in IO_CALLS:
        real = getattr(os, name)
        m.setattr(os, name, lambda *a, _real=real: (counter.__setitem__(0, counter[0] + 1), _real(*a))[1])


def two_demos_and_append_io_count(tmp_path, monkeypatch):
    """A 2-demo file ``base.hdf5`` and the number of I/O calls (write, truncate, fsync, unlink) appending a third makes."""
    base = two_demos(tmp_path)
    scratch = tmp_path / "scratch.hdf5"
    shutil.copy(base, scratch)
    counter = [0]
    with monkeypatch.context() as m:
        _count_io(m, counter)
        H5Writer(scratch, resume=True).append(small(2))
    return base, counter[0]


@pytest.mark.slow
def test_sigkill_at_every_io_point_leaves_whole_episodes(tmp_path, monkeypatch):
    """SIGKILL before (or halfway through) each write/truncate/fsync/unlink of an append: earlier demos survive."""
    base, n = two_demos_and_append_io_count(tmp_path, monkeypatch)
    assert n > 10
    path, outcomes = tmp_path / "e.hdf5", set()
    for k in range(1, n + 2):  # every I/O call of the append, and none
        shutil.copy(base, path)
        journal_path(path).unlink(missing_ok=True)
        pid = _fork(lambda: (_io_hook(k, k % 2 == 0, [0]), H5Writer(path, resume=True).append(small(2))))
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        assert killed == (k <= n), (k, status)
        got = read_h5(path)  # a pending journal is rolled back in memory
        assert_same(got, [small(i) for i in range(len(got))])
        assert len(got) in (2, 3)
        outcomes.add((len(got), pending_journal(path)))
        recover_h5(path)
        assert not journal_path(path).exists()
        with h5py.File(path, "r") as f:  # plain HDF5 opens it after recovery
            assert sorted(f["data"]) == [f"demo_{i}" for i in range(len(got))]
        with H5Writer(path, resume=True) as w:
            w.append(small(len(got)))
        assert_same(read_h5(path), [small(i) for i in range(len(got) + 1)])
    assert {(2, True), (3, False)} <= outcomes  # kills landed both before and after the commit point


@pytest.mark.slow
def test_sigkill_in_a_kept_open_append_leaves_whole_episodes(tmp_path, monkeypatch):
    """The same for a writer's second append, made over the file it kept open from the first."""
    base, path = two_demos(tmp_path), tmp_path / "e.hdf5"

    def two_appends(hook) -> None:
        w = H5Writer(path, resume=True)
        w.append(small(2))
        hook()
        w.append(small(3))

    shutil.copy(base, path)
    counter = [0]
    with monkeypatch.context() as m:  # the second append's I/O calls, counted in this process
        two_appends(lambda: _count_io(m, counter))
    n, outcomes = counter[0], set()
    assert n > 10
    for k in range(1, n + 1):
        shutil.copy(base, path)
        journal_path(path).unlink(missing_ok=True)
        pid = _fork(lambda: two_appends(lambda: _io_hook(k, k % 2 == 0, [0])))
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), (k, status)
        got = read_h5(path)
        assert_same(got, [small(i) for i in range(len(got))])
        assert len(got) in (3, 4)
        outcomes.add((len(got), pending_journal(path)))
        recover_h5(path)
        assert _demos_seen_by_plain_hdf5(path)[0] == sorted(f"demo_{i}" for i in range(len(got)))
    assert {(3, True), (4, False)} <= outcomes


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_signal_at_random_moments_leaves_whole_episodes(sig, tmp_path):
    """A recorder killed (SIGKILL) or interrupted (SIGINT) mid-run: resume sees whole episodes 0..m in both formats."""
    run = tmp_path / "run"
    rng = random.Random(sig)

    def record_forever() -> None:
        rec = EpisodeRecorder(run, env_meta=ENV_META, resume=True)
        while True:
            rec.write(synthetic_record(rec.next_index, rec.next_index, steps=12, image_size=48))

    total = 0
    for _ in range(4):
        pid = _fork(record_forever)
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(pid, sig)
        _, status = os.waitpid(pid, 0)
        if sig == signal.SIGINT:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130, status
            assert not pending_journal(run / "episodes.hdf5")  # rolled back cleanly
        else:
            assert os.WIFSIGNALED(status)
        rec = EpisodeRecorder(run, resume=True)
        assert rec.indices == list(range(rec.next_index)) and rec.next_index >= total
        total = rec.next_index
    want = [synthetic_record(i, i, steps=12, image_size=48) for i in range(total)]
    assert_same(read_h5(run / "episodes.hdf5"), want)
    assert_same([read_npz(rec.npz_path(i)) for i in range(total)], want)


def _demos_seen_by_plain_hdf5(path) -> tuple[list[str], int]:
    """The demo names and ``total`` that HDF5 itself (its own file locking on) reads from ``path``."""
    with h5py.File(path, "r") as f:
        return sorted(f["data"]), int(f["data"].attrs["total"])


def test_a_writer_keeps_the_file_open_and_each_commit_is_a_whole_file(tmp_path):
    """Between appends the writer holds the file open in HDF5 (one view, caches warm), yet what is on disk after each
    append is a whole HDF5 file that plain h5py and rollcap's readers open; close changes no demo."""
    path = tmp_path / "e.hdf5"
    w = H5Writer(path, ENV_META)
    views = []
    for i in range(4):
        w.append(small(i))
        views.append(w._view)
        copy = tmp_path / f"after-{i}.hdf5"
        shutil.copy(path, copy)  # the bytes as they are, while the writer still holds the file open
        assert not pending_journal(path)
        assert _demos_seen_by_plain_hdf5(copy) == (sorted(f"demo_{j}" for j in range(i + 1)), 6 * (i + 1))
        assert_same(read_h5(copy), [small(j) for j in range(i + 1)])
    assert all(v is views[0] for v in views)  # not reopened from one append to the next
    w.close()
    assert w._file is None and not journal_path(path).exists()
    assert _demos_seen_by_plain_hdf5(path) == ([f"demo_{j}" for j in range(4)], 24)
    assert_same(read_h5(path), [small(j) for j in range(4)])


def test_another_writer_between_appends_makes_the_next_append_reopen(tmp_path):
    """A file changed since this writer's last commit (another writer appended): its HDF5 caches are stale, so the
    next append reopens the file instead of writing over the other writer's demo."""
    path = tmp_path / "e.hdf5"
    w = H5Writer(path, ENV_META)
    w.append(small(0))
    kept = w._view
    with H5Writer(path, resume=True) as other:
        other.append(small(1))
    w.append(small(2))
    assert w._view is not kept
    w.close()
    assert_same(read_h5(path), [small(i) for i in range(3)])
    assert _demos_seen_by_plain_hdf5(path) == ([f"demo_{i}" for i in range(3)], 18)


def test_a_forked_child_closing_the_file_writes_nothing(tmp_path):
    """A forked child that closes (or exits with) the parent's open file: nothing reaches the disk (the view is parked
    between appends), and the parent appends on."""
    path = tmp_path / "e.hdf5"
    w = H5Writer(path, ENV_META)
    w.append(small(0))
    before = path.read_bytes()
    pid = os.fork()
    if pid == 0:
        try:
            w._file.close()  # what h5py does to every open file at interpreter exit
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert path.read_bytes() == before and not pending_journal(path)
    w.append(small(1))
    w.close()
    assert_same(read_h5(path), [small(0), small(1)])


def test_a_forked_child_does_not_share_its_parents_journal_lock(tmp_path):
    """The journal a writer keeps open between appends is not a forked child's: while the parent holds its lock
    (mid-append), the child's append through the same writer object is refused, not let in through the shared fd."""
    path = tmp_path / "e.hdf5"
    w = H5Writer(path, ENV_META)
    w.append(small(0))
    fcntl.flock(w._updates._jfd, fcntl.LOCK_EX)  # as during the parent's next append
    try:
        pid = _fork(lambda: w.append(small(1)))
        _, status = os.waitpid(pid, 0)
    finally:
        fcntl.flock(w._updates._jfd, fcntl.LOCK_UN)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1  # the child's RuntimeError: one writer per file
    w.append(small(2))
    w.close()
    assert_same(read_h5(path), [small(0), small(2)])


def test_a_write_between_updates_reaches_nothing_and_marks_the_view_stale(tmp_path):
    """A parked view (between two updates) drops writes and truncates and says so; the next update gets a new view."""
    from rollcap.rollout.recording.journal import JournaledFile

    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 5000)
    updates = JournaledFile(path)
    view = updates.update(lambda v: (v.seek(0), v.write(b"b" * 10)))
    assert path.read_bytes() == b"b" * 10 + b"a" * 4990 and not view.stale
    assert updates.update(lambda v: None) is view  # nothing changed the file: the same view
    view.seek(0)
    view.write(b"c" * 10)
    view.truncate(3)
    assert view.stale and path.read_bytes() == b"b" * 10 + b"a" * 4990
    fresh = updates.update(lambda v: (v.seek(5000), v.write(b"d")))
    assert fresh is not view and path.read_bytes() == b"b" * 10 + b"a" * 4990 + b"d"
    path.write_bytes(b"e" * 3)  # another program changed it: a new view again
    assert updates.update(lambda v: None) is not fresh


def test_one_writer_per_file(tmp_path):
    """While another writer holds the journal, an append is refused and the file is left alone."""
    path, _ = write_all("h5", episodes()[:1], tmp_path)
    before = path.read_bytes()
    fd = os.open(journal_path(path), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="one writer per file"):
            H5Writer(path, resume=True)
        assert_same(read_h5(path), episodes()[:1])  # readers are not blocked by a pending journal
    finally:
        os.close(fd)
    assert path.read_bytes() == before
    with H5Writer(path, resume=True) as w:  # the abandoned (empty) journal is cleared
        w.append(episodes()[1])
    assert not journal_path(path).exists()


def test_failed_append_leaves_file_byte_identical(tmp_path, monkeypatch):
    """An exception mid-append (a bad write, a full disk) rolls back: same bytes, no journal, appends go on."""
    path, _ = write_all("h5", episodes()[:1], tmp_path)
    before = path.read_bytes()
    w = H5Writer(path, resume=True)
    real_put = record_h5._put
    calls = [0]

    def failing_put(group, name, a, file=None):
        calls[0] += 1
        if calls[0] == 6:
            raise RuntimeError("boom")
        real_put(group, name, a, file)

    monkeypatch.setattr(record_h5, "_put", failing_put)
    with pytest.raises(RuntimeError, match="boom"):
        w.append(episodes()[1])
    monkeypatch.setattr(record_h5, "_put", real_put)
    for room in range(4):  # the disk fills after this many writes: in the journal, the pages, the new space
        counted = [0]

        def full_disk(name, real, fd, data, offset, writes=counted, room=room):  # refuses writes needing new blocks
            writes[0] += 1
            size = sum(memoryview(q).nbytes for q in data) if name == "pwritev" else memoryview(data).nbytes
            if writes[0] > room and offset + size > os.fstat(fd).st_size:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, offset)

        with monkeypatch.context() as m:
            for name in ("pwrite", "pwritev"):
                m.setattr(os, name, functools.partial(full_disk, name, getattr(os, name)))
            with pytest.raises(OSError):
                w.append(episodes()[1])
        assert path.read_bytes() == before and not pending_journal(path)
    w.append(episodes()[1])
    assert_same(read_h5(path), episodes()[:2])


# --------------------------------------------------------------------------- corrupt input


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_file_is_corrupt(fmt, tmp_path):
    """A file cut anywhere raises CorruptEpisode naming the file."""
    path, read = write_all(fmt, episodes()[1:2], tmp_path)
    data = path.read_bytes()
    for cut in (0, 7, len(data) // 3, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CorruptEpisode, match=str(path)):
            read()


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_bytes_never_return_different_data(fmt, tmp_path):
    """A flipped byte anywhere: CorruptEpisode or the identical record, never silently different data."""
    records = episodes()[1:2]
    path, read = write_all(fmt, records, tmp_path)
    data = bytearray(path.read_bytes())
    detected = 0
    for pos in np.linspace(0, len(data) - 1, 60).astype(int):
        flipped = bytearray(data)
        flipped[pos] ^= 0x5A
        path.write_bytes(flipped)
        try:
            assert_same(read(), records)
        except CorruptEpisode as err:
            assert str(path) in str(err) and "\n" not in str(err)
            detected += 1
    assert detected > 40


@pytest.mark.parametrize("fmt", FORMATS)
def test_not_a_recording_is_corrupt(fmt, tmp_path):
    """Text, an empty file, or an HDF5 / zip of something else: CorruptEpisode naming the file."""
    path = tmp_path / ("x.npz" if fmt == "npz" else "x.hdf5")
    read = read_npz if fmt == "npz" else read_h5
    for content in (b"", b"hello, not a recording\n" * 10):
        path.write_bytes(content)
        with pytest.raises(CorruptEpisode, match=str(path)):
            read(path)
    if fmt == "npz":
        with open(path, "wb") as fh:
            np.save(fh, np.zeros(3))
        with pytest.raises(CorruptEpisode, match="single array"):
            read(path)
    path.unlink()
    if fmt == "npz":
        np.savez(path, a=np.zeros(3))
    else:
        with h5py.File(path, "w") as f:
            f.create_dataset("a", data=np.zeros(3))
    with pytest.raises(CorruptEpisode, match=str(path)):
        read(path)
    with pytest.raises(FileNotFoundError):
        read(tmp_path / "missing")


def _edit_npz(path, edit) -> None:
    """Rewrite an npz after ``edit(arrays)`` changed its dict of arrays in place (a consistent archive)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    edit(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def h5_demo_meta(f: h5py.File, index: int) -> dict:
    """Demo ``index``'s meta, from the ``meta.json`` of its ``rollcap/fields`` archive."""
    with np.load(io.BytesIO(f[f"data/demo_{index}/rollcap/fields"][()].tobytes()), allow_pickle=False) as z:
        return json.loads(z["meta.json"].tobytes())


def _edit_h5_fields(path, index: int, edit) -> None:
    """Rewrite demo ``index``'s ``rollcap/fields`` archive after ``edit(arrays)`` changed its dict of arrays in place."""
    with h5py.File(path, "r+") as f:
        rc = f[f"data/demo_{index}/rollcap"]
        with np.load(io.BytesIO(rc["fields"][()].tobytes()), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        edit(arrays)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        del rc["fields"]
        rc.create_dataset("fields", data=np.frombuffer(buf.getvalue(), np.uint8))


def _meta_edit(drop: str | None = None, **meta_update):
    """An edit of an archive's arrays: without the array ``drop``, ``meta_update`` in its meta (None removes a key)."""

    def edit(arrays: dict) -> None:
        arrays.pop(drop, None)
        meta = {
            k: v for k, v in (json.loads(bytes(arrays["meta.json"]).decode()) | meta_update).items() if v is not None
        }
        arrays["meta.json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)

    return edit


def _rewrite_npz(path, drop: str | None = None, **meta_update) -> None:
    """Rewrite an npz without the array ``drop`` and with ``meta_update`` in its meta (None removes a key)."""
    _edit_npz(path, _meta_edit(drop, **meta_update))


# --------------------------------------------------------------------------- digest: identity and integrity

TIMINGS = ("latency_policy_s", "latency_critic_s", "latency_boundary_s")


def _old_digest(record) -> str:
    """The digest files carried before ``timings_digest``: every field, latencies included."""
    h = hashlib.sha256(canonical_json(scalar_meta(record)).encode())
    for table in ("initial_state", "obs", "final_obs", "steps", "chunks"):
        arrays = getattr(record, table)
        for k in sorted(arrays):
            a = arrays[k]
            h.update(f"|{table}/{k}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())  # C order, 0-d arrays included
    return "sha256:" + h.hexdigest()


def _flip_latency(arr: np.ndarray) -> np.ndarray:
    out = arr.copy()
    out.view(np.uint8)[3] ^= 0x10
    return out


def _flip_stored_latency(fmt: str, path, index: int, key: str) -> None:
    """Flip a bit of episode ``index``'s latency ``key`` in a written file, keeping the file consistent."""
    if fmt == "npz":
        _edit_npz(path, lambda arrays: arrays.update({f"chunks/{key}": _flip_latency(arrays[f"chunks/{key}"])}))
    else:
        _edit_h5_fields(
            path, index, lambda arrays: arrays.update({f"chunks/{key}": _flip_latency(arrays[f"chunks/{key}"])})
        )


def test_digest_is_identity_timings_aside():
    """Two records equal but for their latencies have equal digests; timings_digest tells them apart."""
    a, b = synthetic_record(3, 9, steps=10), synthetic_record(3, 9, steps=10)
    for k in TIMINGS:
        b.chunks[k] = b.chunks[k] * 1.5
    assert episode_digest(a) == episode_digest(b) and timings_digest(a) != timings_digest(b)
    b.chunks["critic_value"] = _flip_latency(b.chunks["critic_value"])
    assert episode_digest(a) != episode_digest(b)
    assert episode_digest(a) != episode_digest(replace(a, config={**a.config, "horizon": 9}))


@pytest.mark.parametrize("key", TIMINGS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_latency_is_corrupt(fmt, key, tmp_path):
    """A flipped bit in a latency (the file otherwise consistent) is refused: the timings digest catches it."""
    rec = episodes()[1]
    path, read = write_all(fmt, [rec], tmp_path)
    _flip_stored_latency(fmt, path, rec.index, key)
    with pytest.raises(CorruptEpisode, match=rf"{path}: .*timings digest mismatch"):
        read()


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_from_before_timings_digest_still_read(fmt, tmp_path):
    """A file whose digest covers the latencies (no timings_digest) reads back; a flipped latency in it is still caught."""
    records = episodes()
    path, read = write_all(fmt, records, tmp_path)
    paths = [tmp_path / f"episode_{r.index:05d}.npz" for r in records]
    for r, p in zip(records, paths):
        if fmt == "npz":
            _rewrite_npz(p, timings_digest=None, digest=_old_digest(r))
        else:
            _edit_h5_fields(path, r.index, _meta_edit(timings_digest=None, digest=_old_digest(r)))
    assert _old_digest(records[1]) != episode_digest(records[1])
    assert_same(read(), records)
    _flip_stored_latency(fmt, paths[1] if fmt == "npz" else path, 1, "latency_critic_s")
    with pytest.raises(CorruptEpisode, match="content digest mismatch"):
        read()


def test_missing_key_or_wrong_version_is_corrupt(tmp_path):
    """A missing array or another format version raises CorruptEpisode with the file and the problem."""
    rec = episodes()[1]
    npz = tmp_path / "e.npz"
    write_npz(rec, npz)
    _rewrite_npz(npz, format_version=FORMAT_VERSION + 1)
    with pytest.raises(CorruptEpisode, match=rf"{npz}: format version {FORMAT_VERSION + 1}"):
        read_npz(npz)
    write_npz(rec, npz)
    _rewrite_npz(npz, drop="steps/rewards")
    with pytest.raises(CorruptEpisode, match=rf"{npz}: .*rewards"):
        read_npz(npz)
    h5, _ = write_all("h5", [rec], tmp_path)
    _edit_h5_fields(h5, 1, _meta_edit(format_version=99))
    with pytest.raises(CorruptEpisode, match=rf"{h5}: data/demo_1: format version 99"):
        read_h5(h5)
    _edit_h5_fields(h5, 1, _meta_edit(format_version=FORMAT_VERSION))
    with h5py.File(h5, "r+") as f:
        del f["data/demo_1/rewards"]
    with pytest.raises(CorruptEpisode, match=rf"{h5}: data/demo_1: .*rewards"):
        read_h5(h5)
