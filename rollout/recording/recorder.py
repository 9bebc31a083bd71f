"""Recording episodes: the recorder subscriber, round-trip equality, write overhead.

The formats live beside this module: :mod:`~rollcap.rollout.recording.npz`
(one ``.npz`` per episode) and :mod:`~rollcap.rollout.recording.h5` (one
robomimic-layout HDF5 per run), both over the shared
:mod:`~rollcap.rollout.recording.codec`. A run directory looks like::

    <run_dir>/episodes/episode_00000.npz ...
    <run_dir>/episodes.hdf5

Imports point downward: this module knows ``kernels.files``, ``episode``,
``subscribers``, the codec and the two formats; only the package's
``__init__`` imports it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from rollcap.kernels.files import canonical_json, remove_stale_temps
from rollcap.rollout.episode import ACTOR_HUMAN, ACTOR_POLICY, EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording.codec import OPTIONAL_SCALARS, SCALARS, TABLES, byte_view, checked_meta, episode_digest
from rollcap.rollout.recording.h5 import H5Writer
from rollcap.rollout.recording.h5read import h5_indices, read_h5_episode
from rollcap.rollout.recording.journal import _signals_deferred, journal_path
from rollcap.rollout.recording.npz import npz_name_index, read_npz, write_npz
from rollcap.rollout.protocols import EpisodeEnd, Subscriber

FORMATS = ("npz", "h5")
EPISODES_DIR, H5_NAME = "episodes", "episodes.hdf5"


def _array_diff(name: str, a, b) -> str | None:
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return f"{name}: {type(a).__name__} vs {type(b).__name__}"
    if a.dtype.str != b.dtype.str:
        return f"{name}: dtype {a.dtype.str} vs {b.dtype.str}"
    if a.shape != b.shape:
        return f"{name}: shape {a.shape} vs {b.shape}"
    ab, bb = byte_view(a), byte_view(b)
    differ = np.flatnonzero(ab != bb)
    if differ.size == 0:
        return None
    flat = int(differ[0]) // max(a.itemsize, 1)
    at = np.unravel_index(flat, a.shape) if a.ndim else ()
    return f"{name}: bytes differ, first at {tuple(int(i) for i in at)}: {a[at]!r} vs {b[at]!r}"


def records_equal(a: EpisodeRecord, b: EpisodeRecord) -> str | None:
    """None if ``a`` and ``b`` are identical byte for byte, else a line naming the first differing field.

    JSON fields compare by their canonical JSON (so a tuple equals the list it
    reads back as); arrays by dtype (byte order included), shape and bytes (so
    NaN equals the same NaN, and -0.0 differs from 0.0).
    """
    for k in (*SCALARS, *OPTIONAL_SCALARS):
        ja, jb = canonical_json(getattr(a, k)), canonical_json(getattr(b, k))
        if ja != jb:
            return f"{k}: {ja[:80]} vs {jb[:80]}"
    for table in TABLES:
        ta, tb = getattr(a, table), getattr(b, table)
        if sorted(ta) != sorted(tb):
            return f"{table}: keys {sorted(ta)} vs {sorted(tb)}"
        for k in sorted(ta):
            diff = _array_diff(f"{table}[{k!r}]", ta[k], tb[k])
            if diff:
                return diff
    return None


def _npz_indices(directory: Path) -> set[int]:
    return {i for p in directory.glob("episode_*.npz") if (i := npz_name_index(p)) is not None}


class EpisodeRecorder(Subscriber):
    """Subscriber writing every finished episode to a run directory (npz and/or HDF5).

    Each format is written atomically, npz first. Single-threaded: :meth:`write`
    (which the host reaches through :meth:`on_episode_end`) is called on one
    thread once per episode.

    Whoever opened a recorder closes it (:meth:`close`, or ``with
    EpisodeRecorder(...) as rec``): a run or env it was handed (``on_run_end``)
    leaves it open, so a train env and an eval env can share one, and a
    second run can go on with it. Every episode is on disk when its
    :meth:`write` returns; closing only refuses further ones. A recorder
    writes only in the process that opened it: a copy in another process (an
    ``AsyncVectorEnv`` worker, forked or spawned) would write the same
    indices into the same directory, so it refuses (:meth:`check_process`).

    Args:
        run_dir: the run directory (created if missing).
        formats: any of ``"npz"``, ``"h5"``.
        env_meta: robomimic env metadata for the HDF5 file; ``None``: built from
            the first episode as ``{"env_name": env_id, "type": 2, "env_kwargs": ...}``
            (2 is robomimic's gym type).
        resume: continue a run directory that already holds episodes; a crashed
            HDF5 append is rolled back, and an episode present in only one
            format (a crash between the two writes) is copied into the other.
            Without it a directory holding episodes is refused.
    """

    def __init__(self, run_dir, formats=FORMATS, env_meta: dict | None = None, resume: bool = False):
        self.formats = tuple(formats)
        if not self.formats or set(self.formats) - set(FORMATS) or len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats={formats!r}: pick one or both of {FORMATS}")
        self.run_dir = Path(run_dir)
        self.episodes_dir = self.run_dir / EPISODES_DIR
        self.h5_path = self.run_dir / H5_NAME
        self._env_meta, self._h5, self._closed = env_meta, None, False
        self._pid = os.getpid()  # the opener's process: the only one that writes (check_process)
        npz = _npz_indices(self.episodes_dir) if self.episodes_dir.is_dir() else set()
        h5 = set(h5_indices(self.h5_path)) if self.h5_path.exists() else set()
        if (npz or h5 or journal_path(self.h5_path).exists()) and not resume:
            raise FileExistsError(f"{self.run_dir} already holds episodes; pass resume=True to continue that run")
        self.episodes_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.episodes_dir)
        remove_stale_temps(self.run_dir)
        if "h5" in self.formats and (self.h5_path.exists() or npz):
            missing = [read_npz(self.npz_path(i), expect_index=i) for i in sorted(npz - h5)]
            if not self.h5_path.exists():
                env_meta = self._default_env_meta(missing[0])
            self._h5 = H5Writer(self.h5_path, env_meta, resume=True)
            h5 = set(self._h5.indices)
            for record in missing:
                self._h5.append(record)
            h5 |= {r.index for r in missing}
        if "npz" in self.formats and self.h5_path.exists():
            for i in sorted(h5 - npz):
                write_npz(read_h5_episode(self.h5_path, i), self.npz_path(i))
        self._indices = npz | h5

    def _default_env_meta(self, record: EpisodeRecord) -> dict:
        return self._env_meta or {"env_name": record.env_id, "type": 2, "env_kwargs": record.env_kwargs}

    @property
    def next_index(self) -> int:
        """The first episode index after every one recorded in this run directory."""
        return max(self._indices, default=-1) + 1

    @property
    def indices(self) -> list[int]:
        """Indices of the episodes recorded in this run directory, sorted."""
        return sorted(self._indices)

    def npz_path(self, index: int) -> Path:
        """Where episode ``index``'s npz file lives."""
        return self.episodes_dir / f"episode_{index:05d}.npz"

    def write(self, record: EpisodeRecord) -> None:
        """Write ``record`` in every format, all of them or (on a crash or Ctrl-C) none; refuse an index already recorded."""
        self.write_many([record])

    def write_many(self, records: list[EpisodeRecord]) -> list[str]:
        """Write several episodes, each in every format: all of them or (on an error, a crash or Ctrl-C) none; returns their digests.

        The HDF5 file takes them in one commit (:meth:`H5Writer.append_many`), so a writer
        that has fallen behind pays the journal's fsyncs once for what waited. Refuses an index
        already recorded or repeated before anything is written.
        """
        if self._closed:
            raise RuntimeError(f"{self.run_dir}: write() after close()")
        self.check_process()
        indices = [r.index for r in records]
        for i in indices:
            if i in self._indices or indices.count(i) > 1:
                raise ValueError(f"{self.run_dir}: episode {i} is already recorded; indices must be unique")
        if not records:
            return []
        checked = [checked_meta(r) for r in records]  # checked and digested once for both formats
        # Ctrl-C is held across both formats, so an episode is in all of them or none;
        # a failed HDF5 append (a full disk) takes the episodes' npz files back out.
        with _signals_deferred():
            written: list[tuple[int, Path]] = []
            try:
                if "npz" in self.formats:
                    for record, c in zip(records, checked):
                        path = self.npz_path(record.index)
                        write_npz(record, path, c)
                        written.append((record.index, path))
                if "h5" in self.formats:
                    if self._h5 is None:
                        self._h5 = H5Writer(self.h5_path, self._default_env_meta(records[0]), resume=False)
                    self._h5.append_many(records, checked)
            except BaseException:
                kept = set(self._h5.indices) if self._h5 is not None and "h5" in self.formats else set()
                for i, path in written:
                    if i not in kept:
                        path.unlink(missing_ok=True)
                raise
            self._indices.update(indices)
        return [c["digest"] for c in checked]

    def on_episode_ends(self, ends: list[EpisodeEnd]) -> None:
        """:meth:`on_episode_end` for several finished episodes at once (:class:`InBackground` hands over what waits)."""
        records = [e.record for e in ends if e.record is not None]
        if records:
            self.write_many(records)

    def verify(self) -> list[EpisodeRecord]:
        """Read back every recorded episode in every format (digests checked) and check the formats agree.

        Returns the episodes (from npz when recorded, else HDF5), by index.

        Raises:
            CorruptEpisode: a damaged file, a file holding another episode, or formats that disagree.
        """
        out = []
        for i in self.indices:
            copies = []
            if "npz" in self.formats:
                copies.append((self.npz_path(i), read_npz(self.npz_path(i), expect_index=i)))
            if "h5" in self.formats:
                copies.append((f"{self.h5_path}:demo_{i}", read_h5_episode(self.h5_path, i)))
            for where, rec in copies:
                if rec.index != i:
                    raise CorruptEpisode(f"{where}: holds episode {rec.index}, expected {i}")
            digests = {episode_digest(rec) for _, rec in copies}
            if len(digests) > 1:
                raise CorruptEpisode(
                    f"{self.run_dir}: episode {i} differs between {' and '.join(str(w) for w, _ in copies)}"
                )
            out.append(copies[0][1])
        return out

    wants_records = True

    def on_episode_end(self, end: EpisodeEnd) -> None:
        """Called by the host once per finished episode: :meth:`write` its record (a dropped episode has none)."""
        if end.record is not None:
            self.write(end.record)

    def check_process(self) -> None:
        """Refuse (RuntimeError, one line) to write from a process other than the one that opened this recorder."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"{self.run_dir}: this EpisodeRecorder was opened in process {self._pid} and is used in process "
                f"{os.getpid()} (an AsyncVectorEnv worker holds a copy): a copy would write the same episode indices into "
                "the same directory, so it records nothing; record with the batched vector env (gym.make_vec's default "
                "mode) or vectorization_mode='sync', or open one recorder per worker, in the worker, each in its own directory"
            )

    def on_run_end(self) -> None:
        """Called when a run or env that was handed this recorder ends: nothing to do (every episode is on disk), and the
        recorder stays open: whoever opened it closes it (:meth:`close`, or ``with``)."""

    def close(self) -> None:
        """Refuse further episodes; every episode is already on disk (the opener's call; safe to call twice)."""
        if self._h5 is not None:
            self._h5.close()
        self._closed = True

    def __enter__(self) -> EpisodeRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure_write_overhead(record: EpisodeRecord, formats=FORMATS, episodes: int = 5, run_dir=None) -> float:
    """Mean wall seconds one :meth:`EpisodeRecorder.write` takes for episodes like ``record``.

    Writes ``episodes`` copies (indices 0..n-1) into ``run_dir`` (default: a
    temp directory, removed afterwards), so it includes fsyncs and HDF5's
    growing index.
    """
    tmp = None if run_dir is not None else tempfile.mkdtemp(prefix="rollcap-overhead-")
    try:
        recorder = EpisodeRecorder(run_dir or tmp, formats)
        total = 0.0
        for i in range(episodes):
            rec = replace(record, index=i)
            t0 = time.perf_counter()
            recorder.write(rec)
            total += time.perf_counter() - t0
        recorder.close()
        return total / max(episodes, 1)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def synthetic_record(
    index: int = 0, seed: int = 0, steps: int = 20, horizon: int = 8, image_size: int = 64
) -> EpisodeRecord:
    """A seeded, valid episode with every kind of field, for tests and :func:`measure_write_overhead`.

    Two cameras ``[T, S, S, 3]`` uint8, float proprio, float / int / uint64 / 0-d
    initial state, a human takeover in the middle, NaN in a latency, and a
    final chunk stopped before execution (``steps=0``: stopped at the first chunk).
    """
    rng = np.random.default_rng(seed)
    t, a, h = steps, 7, horizon
    starts = [*range(0, t, h), t] if t % h == 0 else [*range(0, t, h)]
    c = len(starts)
    yy, xx = np.mgrid[:image_size, :image_size]
    frame = ((yy + xx) % 256).astype(np.uint8)[None, :, :, None]

    def images() -> np.ndarray:
        return (frame + rng.integers(0, 8, (t, image_size, image_size, 3), dtype=np.uint8)).astype(np.uint8)

    actor = np.full(t, ACTOR_POLICY, np.uint8)
    actor[t // 3 : t // 2] = ACTOR_HUMAN
    terminated = np.zeros(t, bool)
    truncated = np.zeros(t, bool)
    if t and t % h:
        terminated[-1] = True
    latency = rng.uniform(1e-3, 5e-3, c)
    latency[-1] = np.nan
    return EpisodeRecord(
        index=index,
        seed=seed,
        env_id="PushBlock-v0",
        env_kwargs={"image_size": image_size, "max_steps": 200, "cameras": ["front", "wrist"]},
        instruction=f"push the red block left ({seed}) \u2192 ok",
        initial_state={
            "mj_state": rng.standard_normal(23),
            "rng": rng.integers(0, 2**63, 6, dtype=np.uint64),
            "step": np.array(0, np.int64),
        },
        obs={
            "agentview_image": images(),
            "wrist_image": images(),
            "proprio": rng.standard_normal((t, 9)).astype(np.float32),
        },
        final_obs={
            "agentview_image": images()[:1].reshape(image_size, image_size, 3) if t else frame[0].repeat(3, -1),
            "proprio": rng.standard_normal(9).astype(np.float32),
        },
        steps={
            "actions": rng.uniform(-1, 1, (t, a)).astype(np.float32),
            "rewards": rng.standard_normal(t),
            "terminated": terminated,
            "truncated": truncated,
            "dones": terminated | truncated,
            "actor": actor,
            "states": rng.standard_normal((t, 23)),
        },
        chunks={
            "noise": rng.standard_normal((c, h, a)).astype(np.float32),
            "policy_chunk": rng.uniform(-1, 1, (c, h, a)).astype(np.float32),
            "critic_value": np.linspace(0.9, 0.1, c, dtype=np.float32),
            "chunk_start": np.array(starts, np.int64),
            "latency_policy_s": rng.uniform(1e-3, 5e-3, c),
            "latency_critic_s": rng.uniform(1e-3, 5e-3, c),
            "latency_boundary_s": latency,
        },
        stop_reason="critic" if t % h == 0 else "env_done",
        success=bool(index % 2),
        fingerprints={"policy": {"weights": f"sha256:{seed:064x}", "dtype": "float32"}, "critic": {"threads": 2}},
        config={"critic_threshold": 0.2, "horizon": h, "noise": [0.0, 1.5]},
    )
