"""Sharded runs: every actor records its own shard; the driver writes only a manifest.

A sharded run directory::

    <run_dir>/manifest.jsonl                 which episode is where (append-only)
    <run_dir>/shards/s000/episodes/episode_00003.npz ...
    <run_dir>/shards/s000/episodes.hdf5
    <run_dir>/shards/s001/...
    <run_dir>/summary.json

A **shard** is an ordinary run directory written by one
:class:`~rollcap.rollout.recording.recorder.EpisodeRecorder` (one actor, one
writer): atomic npz files, the HDF5 file appended through the rollback
journal, digests in both. The shard ``"."`` is the run directory's own
layout (episodes recorded before the run was sharded, e.g. by a local
session that a run on actors resumed).

The **manifest** is JSON lines. The first is the header
``{"env_meta": {...}, "formats": [...], "rollcap_manifest": 1}`` (the robomimic
env metadata every shard's HDF5 file carries), created atomically (temp file,
rename). Each later line names one recorded episode::

    {"digest": "...", "index": 3, "node": "...", "shard": "shards/s000", "status": "recorded"}

appended with one ``write`` and an ``fsync`` once the shard holds the episode
in every format. The manifest is the commit point: an episode is part of the
run when its line is whole (newline included). A torn last line (a crash
mid-append) is ignored by readers and cut by :class:`ManifestWriter` on
resume; a damaged line before the last is :class:`CorruptEpisode`. An index
has at most one line. A shard may hold episodes the manifest does not name
(an actor killed after writing one, before the driver heard of it): readers
ignore them, a resume adopts one whose index the manifest lacks (after
repairing its shard: a hot HDF5 journal rolled back, a missing format
copied in; an npz-only copy of an episode the manifest names in another
shard is removed, not copied in), :func:`merge` leaves them out. Env workers
adopt a dead worker's orphans at once (:meth:`ManifestWriter.orphans`), so they
never run again elsewhere.

Readers see a sharded run as one run in index order
(:mod:`~rollcap.rollout.recording.runs`), each episode read from its shard
(npz when recorded, else HDF5) and its digest checked against the manifest's.
:func:`merge` writes today's single-file layout (``episodes/`` and
``episodes.hdf5`` in the run directory) and then removes the manifest and the
shards; a merge cut short is finished by running it again.

A shard named by an absolute path (a per-node directory: ``rollcap run
--shard-dir DIR`` writes ``DIR/<run name>/sNNN`` on each actor's node) is
read there, or, once copied back, from ``<run_dir>/shards/<its name>`` or
from ``<d>/<its name>`` for a directory ``d`` the reader is given
(``rollcap merge RUN --from D``). Shard names are numbered by the driver
across all nodes, so the shards of every node can be copied into one
directory. A shard found nowhere is one :class:`CorruptEpisode` line naming
the episode, its node and every place looked.

Imports point downward: this module knows ``kernels.files``, ``episode``,
``errors``, the codec, the formats and the recorder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollcap.kernels.files import (
    atomic_write,
    canonical_json,
    fsync_dir,
    remove_stale_temps,
)
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import ConfigError, CorruptEpisode
from rollcap.rollout.recording.codec import corrupt, episode_digest
from rollcap.rollout.recording.h5read import h5_indices, read_h5_episode
from rollcap.rollout.recording.journal import _signals_deferred
from rollcap.rollout.recording.npz import npz_name_index, read_npz
from rollcap.rollout.recording.recorder import (
    EPISODES_DIR,
    FORMATS,
    H5_NAME,
    EpisodeRecorder,
)

MANIFEST, SHARDS_DIR = "manifest.jsonl", "shards"
VERSION = 1
RECORDED = "recorded"


@dataclass(frozen=True)
class Entry:
    """One manifest line: episode ``index`` is in ``shard`` (relative to the run directory, or absolute) with ``digest``."""

    index: int
    digest: str
    shard: str
    node: str | None = None

    def line(self) -> bytes:
        return (
            canonical_json(
                {"index": self.index, "digest": self.digest, "shard": self.shard, "node": self.node, "status": RECORDED}
            )
            + "\n"
        ).encode()


def is_sharded(run_dir) -> bool:
    """True if ``run_dir`` is a sharded run (it has a manifest)."""
    return (Path(run_dir) / MANIFEST).is_file()


def read_manifest(run_dir) -> tuple[dict, dict[int, Entry], int]:
    """``(header, entries by index, bytes of whole lines)`` of ``run_dir``'s manifest; a torn last line is left out.

    Raises:
        CorruptEpisode: no header, a damaged line before the last, or an index named twice.
    """
    path = Path(run_dir) / MANIFEST
    raw = path.read_bytes()
    whole = raw[: raw.rfind(b"\n") + 1]
    lines = whole.splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("rollcap_manifest") != VERSION:
        raise corrupt(path, f"no rollcap manifest header (version {VERSION}) on the first line")
    entries: dict[int, Entry] = {}
    for n, line in enumerate(lines[1:], start=2):
        try:
            d = json.loads(line)
            entry = Entry(int(d["index"]), str(d["digest"]), str(d["shard"]), d.get("node"))
        except (ValueError, KeyError, TypeError) as err:
            raise corrupt(path, f"line {n} is not a manifest entry ({err})") from err
        if d.get("status") != RECORDED:
            continue
        if entry.index in entries:
            raise corrupt(path, f"line {n} names episode {entry.index} again (first in {entries[entry.index].shard})")
        entries[entry.index] = entry
    return header, entries, len(whole)


def shard_places(run_dir, shard: str, search=()) -> list[Path]:
    """Where ``shard`` may be, in the order looked: as named (relative to ``run_dir``, or absolute), then
    ``<run_dir>/shards/<its name>`` and ``<d>/<its name>`` for each ``d`` in ``search`` (a shard copied back from its node)."""
    run_dir, name = Path(run_dir), Path(shard).name
    return list(
        dict.fromkeys(
            [
                run_dir / shard,
                *([run_dir / SHARDS_DIR / name] if name else []),
                *(Path(d) / name for d in search if name),
            ]
        )
    )


def shard_path(run_dir, shard: str, search=()) -> Path:
    """The first of :func:`shard_places` that is a directory (the first place when none is)."""
    places = shard_places(run_dir, shard, search)
    return next((p for p in places if p.is_dir()), places[0])


def read_entry(run_dir, entry: Entry, formats=FORMATS, every: bool = False, search=()) -> EpisodeRecord:
    """Episode ``entry`` from its shard (npz when recorded, else HDF5; ``every``: each format, and they must agree), digest checked.

    ``search``: more directories holding shards copied back from their nodes (:func:`shard_places`).

    Raises:
        CorruptEpisode: the shard is nowhere, or its copy is missing, damaged, or not the episode the manifest names.
    """
    root = shard_path(run_dir, entry.shard, search)
    if not root.is_dir():
        places = ", ".join(map(str, shard_places(run_dir, entry.shard, search)))
        node = f" on node {entry.node}" if entry.node else ""
        raise CorruptEpisode(
            f"episode {entry.index}: its shard {entry.shard} (written{node}) is not here: looked in {places}; copy it back from that node"
        )
    copies = []
    for fmt in [f for f in ("npz", "h5") if f in formats][: None if every else 1]:
        if fmt == "npz":
            where = root / EPISODES_DIR / f"episode_{entry.index:05d}.npz"
            if not where.is_file():
                raise corrupt(where, f"missing: the manifest names episode {entry.index} in shard {entry.shard}")
            copies.append((where, read_npz(where, expect_index=entry.index)))
        else:
            where = root / H5_NAME
            try:
                copies.append((f"{where}:demo_{entry.index}", read_h5_episode(where, entry.index)))
            except (KeyError, FileNotFoundError) as err:
                raise corrupt(where, f"no demo_{entry.index}, which the manifest names in shard {entry.shard}") from err
    for where, rec in copies:
        if episode_digest(rec) != entry.digest:
            raise corrupt(
                where,
                f"episode {entry.index} has digest {episode_digest(rec)[:16]}..., the manifest {entry.digest[:16]}...",
            )
    return copies[0][1]


def iter_sharded(run_dir, search=(), every: bool = False) -> Iterator[tuple[str, EpisodeRecord | Exception]]:
    """``(source, record or its CorruptEpisode)`` of every episode the manifest names, in index order (``search``,
    ``every``: :func:`read_entry`'s)."""
    header, entries, _ = read_manifest(run_dir)
    for i in sorted(entries):
        entry = entries[i]
        root = shard_path(run_dir, entry.shard, search)
        formats = header.get("formats", FORMATS)
        source = str(root / EPISODES_DIR / f"episode_{i:05d}.npz") if "npz" in formats else f"{root / H5_NAME}:demo_{i}"
        try:
            yield source, read_entry(run_dir, entry, formats, every=every, search=search)
        except CorruptEpisode as err:
            yield source, err


class ManifestWriter:
    """The driver's side of a sharded run: the manifest, appended one whole line per recorded episode.

    Single-threaded. Creating it starts a manifest (``resume=False``) or
    continues one (a torn last line cut off, orphan episodes of the shards and
    of the run directory's own layout adopted, see the module docstring).

    Args:
        run_dir: the run directory (created if missing).
        formats: the formats every shard records.
        env_meta: robomimic's env metadata for the shards' HDF5 files (kept in the header; on resume it must match).
        resume: continue the run in ``run_dir``.
    """

    def __init__(self, run_dir, formats=FORMATS, env_meta: dict | None = None, resume: bool = False):
        self.run_dir, self.formats, self.env_meta = Path(run_dir), tuple(formats), env_meta
        self.path = self.run_dir / MANIFEST
        self.discarded: list[int] = []  # nothing queues here: the actors wrote their episodes already
        if self.path.exists():
            if not resume:
                raise FileExistsError(f"{self.run_dir} already holds a sharded run; pass resume=True to continue it")
            header, self.entries, size = read_manifest(self.run_dir)
            _same_recording(self.run_dir, header, self.formats, env_meta)
            self.env_meta = header.get("env_meta")
            if size != self.path.stat().st_size:
                os.truncate(self.path, size)  # a torn append: the episode it named is adopted from its shard below
        else:
            self.entries = {}
            self.run_dir.mkdir(parents=True, exist_ok=True)
            header = (
                canonical_json({"rollcap_manifest": VERSION, "formats": list(self.formats), "env_meta": env_meta})
                + "\n"
            )
            atomic_write(self.path, lambda tmp: Path(tmp).write_text(header))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if resume:
            try:
                self._adopt()
            except BaseException:
                self.close()
                raise

    @property
    def indices(self) -> list[int]:
        """Indices of the episodes the run holds, sorted."""
        return sorted(self.entries)

    def shard_names(self) -> list[str]:
        """The shard directories under ``<run_dir>/shards``, by name."""
        d = self.run_dir / SHARDS_DIR
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def add(self, index: int, digest: str, shard: str, node: str | None = None) -> None:
        """Name episode ``index`` (already in ``shard``, every format) in the manifest: one whole line, fsynced.

        Raises:
            ValueError: ``index`` is named already.
        """
        if index in self.entries:
            raise ValueError(
                f"{self.run_dir}: episode {index} is already recorded (in {self.entries[index].shard}); indices must be unique"
            )
        entry = Entry(int(index), digest, shard, node)
        line = entry.line()
        with _signals_deferred():
            if os.write(self._fd, line) != len(line):
                raise OSError(f"{self.path}: short write")
            os.fsync(self._fd)
            self.entries[entry.index] = entry

    def verify(self) -> list[EpisodeRecord]:
        """Read back every episode the manifest names, every format, digests checked against it; by index."""
        return [read_entry(self.run_dir, self.entries[i], self.formats, every=True) for i in self.indices]

    def _adopt(self) -> None:
        """Name in the manifest the whole episodes of the shards (and of the run directory's own layout) it lacks."""
        shards = [str(Path(SHARDS_DIR) / name) for name in self.shard_names()]
        if (self.run_dir / EPISODES_DIR).is_dir() or (self.run_dir / H5_NAME).exists():
            shards.insert(0, ".")
        for shard in shards:
            for record in self.orphans(shard):
                self.add(record.index, episode_digest(record), shard)

    def orphans(self, shard: str) -> list[EpisodeRecord]:
        """The whole episodes of ``shard`` (relative to the run directory) that the manifest does not name, by index, once
        the shard is repaired as a resume repairs it: stale temp files removed, a hot HDF5 journal rolled back, a format
        missing copied in from the other. Call it only on a shard no one writes any more (its writer dead or done).

        An npz copy of an episode the manifest names in another shard, which the shard's HDF5 file lacks, is removed first
        (its writer was killed after writing it and before the manifest named it, and it ran again elsewhere): the
        repair would otherwise copy it into this shard's HDF5 file too, and a reader of the shards would see it twice.
        """
        root = self.run_dir / shard
        if not root.is_dir():
            return []
        remove_stale_temps(root)
        self._drop_strays(shard, root)
        with EpisodeRecorder(root, self.formats, self.env_meta, resume=True) as rec:
            return [_read_shard_episode(root, i, self.formats) for i in rec.indices if i not in self.entries]

    def _drop_strays(self, shard: str, root: Path) -> None:
        """Remove the npz files of ``root`` whose episode the manifest names in another shard (see :meth:`orphans`)."""
        strays = {
            i: path
            for path in (root / EPISODES_DIR).glob("episode_*.npz")
            if (i := npz_name_index(path)) is not None and i in self.entries and self.entries[i].shard != shard
        }
        if not strays:
            return
        h5 = root / H5_NAME
        kept = set(h5_indices(h5)) if h5.exists() else set()  # as committed (a killed writer's journal: rolled back)
        for i, path in strays.items():
            if i not in kept:
                path.unlink()
        fsync_dir(root / EPISODES_DIR)

    def abandon(self) -> None:
        """Nothing queues here (the actors wrote their episodes already)."""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _same_recording(run_dir: Path, header: dict, formats: tuple, env_meta: dict | None) -> None:
    """Refuse to resume a sharded run in other formats or another env, naming the option (as a resumed run's checks do).

    Raises:
        ConfigError: ``formats``, ``env_id`` or ``env_kwargs``, with the run's value and this one's.
    """
    was = tuple(header.get("formats", ()))
    if was != formats:
        raise ConfigError(
            "formats",
            f"{run_dir} records {','.join(was)}; `resume=True` needs the same formats, got {','.join(formats)}",
        )
    stored = header.get("env_meta") or {}
    if env_meta is None or canonical_json(stored) == canonical_json(env_meta):
        return
    for key, option in (("env_name", "env_id"), ("type", "env_id"), ("env_kwargs", "env_kwargs")):
        if canonical_json(stored.get(key)) != canonical_json(env_meta.get(key)):
            shown = (canonical_json(d.get(key)) if key != "env_name" else d.get(key) for d in (stored, env_meta))
            raise ConfigError(option, "{} was recorded with {} {}; `resume=True` needs the same, got {}".format(
                run_dir, "env" if option == "env_id" else option, *shown))  # fmt: skip
    raise ConfigError("env_id", f"{run_dir}: recorded in {canonical_json(stored)}; `resume=True` needs the same env")


def _read_shard_episode(root: Path, index: int, formats) -> EpisodeRecord:
    """Episode ``index`` of the shard at ``root``, read in every format, which must agree."""
    copies = []
    if "npz" in formats:
        copies.append(read_npz(root / EPISODES_DIR / f"episode_{index:05d}.npz", expect_index=index))
    if "h5" in formats:
        copies.append(read_h5_episode(root / H5_NAME, index))
    if len({episode_digest(r) for r in copies}) > 1:
        raise corrupt(root, f"episode {index} differs between the shard's formats")
    return copies[0]


def merge(run_dir, search=()) -> int:
    """Consolidate a sharded run into the single-file layout (``episodes/``, ``episodes.hdf5``) in index order; returns the episodes merged.

    Episodes are copied from their shards (digests checked), the result is
    read back and checked against the manifest, and only then are the
    manifest (the commit point: from there readers see the single-file
    layout) and ``<run_dir>/shards`` removed (shards outside the run
    directory, per-node or in ``search``, are left as they are). Interrupted,
    it is finished by running it again. ``search``: :func:`read_entry`'s.

    Raises:
        FileNotFoundError: ``run_dir`` is not a sharded run.
        CorruptEpisode: an episode the manifest names cannot be read from its shard, or its shard is nowhere.
    """
    run_dir = Path(run_dir)
    if not is_sharded(run_dir):
        raise FileNotFoundError(f"{run_dir}: no {MANIFEST}; not a sharded run (nothing to merge)")
    header, entries, _ = read_manifest(run_dir)
    formats = tuple(header.get("formats", FORMATS))
    with EpisodeRecorder(
        run_dir, formats, header.get("env_meta"), resume=True
    ) as rec:  # a merge cut short goes on where it stopped
        have = set(rec.indices)
        for i in sorted(entries):
            if entries[i].shard == "." or i in have:
                continue
            rec.write(read_entry(run_dir, entries[i], formats, search=search))
        merged = {r.index: episode_digest(r) for r in rec.verify()}
    want = {i: e.digest for i, e in entries.items()}
    if merged != want:
        extra, lacking = sorted(set(merged) - set(want)), sorted(set(want) - set(merged))
        raise CorruptEpisode(
            f"{run_dir}: the merged episodes differ from the manifest (extra {extra}, lacking {lacking}); the shards are kept"
        )
    (run_dir / MANIFEST).unlink()
    fsync_dir(run_dir)
    shutil.rmtree(run_dir / SHARDS_DIR, ignore_errors=True)
    return len(merged)
