"""Reading a recording whatever its shape: an npz file, an HDF5 file or a run directory (sharded or not).

:func:`load_any` / :func:`iter_any` give the episodes in index order and raise
on the first damaged one; :func:`episodes_of` / :func:`iter_episodes` give each
episode or its error separately, so a check can go on past a damaged episode.
Every tool that reads runs (replay, inspect, branch, recap, export) reads them here.
A sharded run (:mod:`~rollcap.rollout.recording.shards`: a ``manifest.jsonl``)
reads as one run in index order, each episode from its shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording.codec import corrupt
from rollcap.rollout.recording.h5 import h5_indices, read_h5_episode
from rollcap.rollout.recording.npz import npz_name_index, read_npz
from rollcap.rollout.recording.recorder import EPISODES_DIR, H5_NAME
from rollcap.rollout.recording.shards import is_sharded, iter_sharded

_ZIP_MAGIC, _HDF5_MAGIC = b"PK\x03\x04", b"\x89HDF\r\n\x1a\n"


def load_any(path) -> list[EpisodeRecord]:
    """Episodes from an ``.npz`` file, an HDF5 file, or a run directory, sorted by index.

    A sharded run directory is read through its manifest (each episode from
    its shard, its digest checked against the manifest's). Another run directory is read from its ``episodes/episode_NNNNN.npz`` when it
    has any (each must hold the episode its name gives), else from
    ``episodes.hdf5``. The whole run is in memory at once: to go through a
    large run, iterate :func:`iter_any` instead.

    Raises:
        CorruptEpisode: a file that is neither format, a damaged one, or an
            npz of a run directory holding another episode than its name says.
        FileNotFoundError: nothing to read at ``path``.
    """
    return list(iter_any(path))


def iter_any(path) -> Iterator[EpisodeRecord]:
    """The episodes :func:`load_any` returns, in the same order, read one at a time.

    Memory stays that of one episode however large the run. The path is
    checked on the first ``next()``; the errors are :func:`load_any`'s.
    """
    path = Path(path)
    if path.is_dir() and is_sharded(path):
        for _, rec in iter_sharded(path):
            if isinstance(rec, Exception):
                raise rec
            yield rec
        return
    if path.is_dir():
        npz = _named_npz(path / EPISODES_DIR) or _named_npz(path)
        if npz:  # sorted by the index in the name, and each file must hold that index
            for i, p in npz:
                yield read_npz(p, expect_index=i)
            return
        if (path / H5_NAME).is_file():
            yield from _iter_h5(path / H5_NAME)
            return
        raise FileNotFoundError(f"{path}: no {EPISODES_DIR}/episode_*.npz and no {H5_NAME}; is it a run directory?")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or run directory")
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith(_ZIP_MAGIC):
        yield read_npz(path)
    elif head == _HDF5_MAGIC:
        yield from _iter_h5(path)
    else:
        raise corrupt(path, "neither an npz archive nor an HDF5 file")


def _iter_h5(path: Path) -> Iterator[EpisodeRecord]:
    """``read_h5(path)``, one demo at a time (each read under its own short shared lock)."""
    for i in h5_indices(path):
        yield read_h5_episode(path, i)


def _named_npz(directory: Path) -> list[tuple[int, Path]]:
    """``(index, path)`` of the ``episode_NNNNN.npz`` files in ``directory``, by name."""
    found: dict[int, Path] = {}
    for p in sorted(directory.glob("episode_*.npz")):
        i = npz_name_index(p)
        if i is not None and found.setdefault(i, p) != p:
            raise corrupt(p, f"names episode {i}, as {found[i].name} does; keep one file per episode")
    return sorted(found.items())


def _npz_files(directory: Path) -> list[Path]:
    """The ``episode_*.npz`` files of a run directory's ``episodes/``, else of ``directory`` itself (a bare ``episodes/``), sorted.

    The same files :func:`iter_any` reads, so a bare directory of npz files is checked file by file, as its run is.
    """
    return sorted((directory / EPISODES_DIR).glob("episode_*.npz")) or sorted(directory.glob("episode_*.npz"))


def episodes_of(path) -> list[tuple[str, EpisodeRecord | Exception]]:
    """Every episode at ``path`` (npz file, HDF5 file or run directory), each read on its own.

    A damaged episode inside an otherwise readable file, or a damaged npz file of
    a run directory (or of a bare ``episodes/`` directory), comes back as its
    exception, so the rest can still be checked. A path that cannot be read at
    all raises (``CorruptEpisode`` / ``FileNotFoundError``). The whole run is
    in memory at once; :func:`iter_episodes` reads one episode at a time.
    """
    return list(iter_episodes(path))


def iter_episodes(path) -> Iterator[tuple[str, EpisodeRecord | Exception]]:
    """:func:`episodes_of`, one ``(source, record or error)`` at a time: memory is one episode's, however large the run.

    A path that cannot be read at all raises on the first ``next()``.
    """
    path = Path(path)
    if path.is_dir() and is_sharded(path):
        yield from iter_sharded(path)
        return
    npz = _npz_files(path) if path.is_dir() else []
    h5 = path / H5_NAME if path.is_dir() and not npz else path
    if npz:
        for p in npz:
            try:
                yield str(p), read_npz(p, expect_index=npz_name_index(p))
            except CorruptEpisode as err:
                yield str(p), err
        return
    if h5.is_file() and h5.suffix in (".hdf5", ".h5"):
        try:
            indices = h5_indices(h5)
        except CorruptEpisode:
            indices = None
        if indices is not None:
            for i in indices:
                try:
                    yield f"{h5}:demo_{i}", read_h5_episode(h5, i)
                except CorruptEpisode as err:
                    yield f"{h5}:demo_{i}", err
            return
    for r in iter_any(path):  # raises the one-line error for what cannot be read
        yield str(path), r
