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
from rollcap.rollout.recording.codec import corrupt, episode_digest
from rollcap.rollout.recording.h5read import h5_indices, read_h5_episode
from rollcap.rollout.recording.npz import npz_name_index, read_npz
from rollcap.rollout.recording.recorder import EPISODES_DIR, H5_NAME
from rollcap.rollout.recording.shards import SHARDS_DIR, is_sharded, iter_sharded

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
        if is_sharded(path.parent) and path.name in (H5_NAME, EPISODES_DIR):
            raise FileNotFoundError(
                f"{path}: no such file; {path.parent} is a sharded run (its episodes are in {path.parent / SHARDS_DIR}/*/): "
                f"name the run directory itself, or `rollcap merge {path.parent}` first for one {EPISODES_DIR}/ and {H5_NAME}"
            )
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


def iter_episodes(path, every_format: bool = False) -> Iterator[tuple[str, EpisodeRecord | Exception]]:
    """:func:`episodes_of`, one ``(source, record or error)`` at a time: memory is one episode's, however large the run.

    ``every_format`` (a run check: ``rollcap replay``, ``rollcap inspect``): a run directory that recorded both formats
    is checked in both. Each episode is read from its npz file and from the HDF5 file, and they must agree (an
    episode whose HDF5 copy is missing, damaged or different comes back as that error); an HDF5 file that cannot be
    read at all is one error of its own (source: the file), and a demo with no npz beside it another. A sharded run
    reads every format of each episode from its shard. Without it, the npz files are read when there are any.
    An HDF5 file with a ``data`` group and no demo is one error (nothing in it to check).

    A path that cannot be read at all raises on the first ``next()``.
    """
    path = Path(path)
    if path.is_dir() and is_sharded(path):
        yield from iter_sharded(path, every=every_format)
        return
    npz = _npz_files(path) if path.is_dir() else []
    h5 = path / H5_NAME if path.is_dir() and not npz else path
    if npz:
        beside = path / H5_NAME if every_format and npz[0].parent == path / EPISODES_DIR else None
        yield from _npz_episodes(npz, beside if beside is not None and beside.is_file() else None)
        return
    if h5.is_file() and h5.suffix in (".hdf5", ".h5"):
        try:
            indices = h5_indices(h5)
        except CorruptEpisode:
            indices = None
        if indices == []:
            yield str(h5), corrupt(h5, "its 'data' group holds no demo: no episode to read")
            return
        if indices is not None:
            for i in indices:
                try:
                    yield f"{h5}:demo_{i}", read_h5_episode(h5, i)
                except CorruptEpisode as err:
                    yield f"{h5}:demo_{i}", err
            return
    for r in iter_any(path):  # raises the one-line error for what cannot be read
        yield str(path), r


def source_index(source: str | None) -> int | None:
    """The episode a source of :func:`iter_episodes` names (``.../episode_00003.npz``, ``...hdf5:demo_3``); None for a
    whole file."""
    if not source:
        return None
    if source.endswith(".npz"):
        return npz_name_index(source)
    _, sep, tail = source.rpartition(":demo_")
    return int(tail) if sep and tail.isdigit() else None


def _npz_episodes(npz: list[Path], h5: Path | None) -> Iterator[tuple[str, EpisodeRecord | Exception]]:
    """The episodes of a run's npz files, each checked against its copy in ``h5`` (the run's HDF5 file) when given."""
    indices: set[int] = set()
    if h5 is not None:
        try:
            indices = set(h5_indices(h5))
        except CorruptEpisode as err:  # the whole file: one failure; the npz episodes are still checked
            yield str(h5), err
            h5 = None
    named = set()
    for p in npz:
        i = npz_name_index(p)
        named.add(i)
        try:
            rec = read_npz(p, expect_index=i)
            if h5 is not None:
                _check_h5_copy(h5, indices, rec, p)
        except CorruptEpisode as err:
            yield str(p), err
            continue
        yield str(p), rec
    for i in sorted(indices - named) if h5 is not None else ():
        yield f"{h5}:demo_{i}", corrupt(h5, f"demo_{i} has no {EPISODES_DIR}/episode_{i:05d}.npz beside it")


def _check_h5_copy(h5: Path, indices: set[int], rec: EpisodeRecord, npz: Path) -> None:
    """Raise CorruptEpisode unless ``h5`` holds ``rec`` (read from ``npz``) whole and the same."""
    if rec.index not in indices:
        raise corrupt(h5, f"no demo_{rec.index}, though {npz.name} holds that episode; the run's formats disagree")
    if episode_digest(read_h5_episode(h5, rec.index)) != episode_digest(rec):
        raise corrupt(h5, f"demo_{rec.index} is not the episode {npz.name} holds; the run's formats disagree")
