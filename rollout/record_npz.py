"""One episode per ``.npz`` file, plus the codec both recording formats share.

npz keys (flat; readable with ``np.load(path, allow_pickle=False)``)::

    meta.json            uint8 array of UTF-8 JSON: format, format_version, index,
                         seed, env_id, env_kwargs, instruction, stop_reason,
                         success, fingerprints, config, num_steps, num_chunks,
                         codec, digest
    initial_state/<k>    env.get_state() right after reset
    obs/<k>              [T, ...] observation before each step
    final_obs/<k>        observation after the last step
    steps/<k>            see episode.STEP_DTYPES
    chunks/<k>           see episode.CHUNK_DTYPES

``digest`` is a SHA-256 over every field (see :func:`episode_digest`); readers
recompute it, so a damaged file raises :class:`CorruptEpisode` and never
returns different data. The archive is ``np.savez_compressed``'s format; files
holding images (uint8, ndim 4) are deflated at level 1 (``codec: "deflate-1"``),
others stored (``"stored"``). Writes are atomic:
a temp file in the same directory, fsync, ``os.replace``, fsync the directory.

Imports point downward: this module knows ``episode`` and ``errors`` only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from rollcap.rollout.episode import FORMAT_VERSION, EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode

FORMAT_NAME = "rollcap.episode"
TABLES = ("initial_state", "obs", "final_obs", "steps", "chunks")
"""The dict-of-array fields of an :class:`EpisodeRecord`, in canonical order."""
SCALARS = ("index", "seed", "env_id", "env_kwargs", "instruction", "stop_reason", "success", "fingerprints", "config")
"""The JSON-able fields of an :class:`EpisodeRecord`, in canonical order."""
NPZ_DEFLATE, NPZ_STORED = "deflate-1", "stored"
"""``meta.json``'s ``codec``: image-bearing files are deflated (level 1), others stored."""
_ARRAY_KINDS = "biufc"  # bool, int, uint, float, complex: no objects, no strings


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable; record plain numbers, strings, lists and dicts")


def dumps(obj) -> str:
    """Canonical JSON (sorted keys, no spaces, numpy scalars as Python numbers)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def is_image(a: np.ndarray) -> bool:
    """True for a per-step image stack: uint8 with 4 dims ``[T, H, W, C]``."""
    return a.dtype == np.uint8 and a.ndim == 4


def scalar_meta(record: EpisodeRecord) -> dict:
    """The JSON-able fields of ``record`` as plain Python values."""
    meta = {k: json.loads(dumps(getattr(record, k))) for k in SCALARS}
    meta["index"], meta["seed"], meta["success"] = int(record.index), int(record.seed), bool(record.success)
    return meta


def check_record(record: EpisodeRecord) -> None:
    """Raise ``ValueError`` if ``record`` cannot be recorded exactly (names, dtypes, lengths, JSON)."""
    record.validate()
    for table in TABLES:
        for k, a in getattr(record, table).items():
            if not isinstance(k, str) or not k or "/" in k or k != k.strip():
                raise ValueError(f"episode {record.index}: {table} key {k!r} must be a non-empty name without '/'")
            if not isinstance(a, np.ndarray) or a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None:
                what = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"episode {record.index}: {table}[{k!r}] is {what}; record numeric or bool numpy arrays")
    for k in ("env_kwargs", "fingerprints", "config"):
        try:
            dumps(getattr(record, k))
        except (TypeError, ValueError) as err:
            raise ValueError(f"episode {record.index}: {k} is not JSON-able: {err}") from err


def byte_view(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` in C order, as a flat uint8 array (no copy when already contiguous)."""
    return np.require(a, requirements="C").reshape(-1).view(np.uint8)


def iter_fields(record: EpisodeRecord) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``("<table>/<key>", array)`` for every array of ``record`` in canonical order."""
    for table in TABLES:
        arrays = getattr(record, table)
        for k in sorted(arrays):
            yield f"{table}/{k}", arrays[k]


def episode_digest(record: EpisodeRecord) -> str:
    """SHA-256 over the JSON fields and every array's name, dtype, shape and bytes."""
    h = hashlib.sha256(dumps(scalar_meta(record)).encode())
    for name, a in iter_fields(record):
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(byte_view(a))
    return "sha256:" + h.hexdigest()


def episode_meta(record: EpisodeRecord, codec) -> dict:
    """The meta dict stored with an episode in both formats."""
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **scalar_meta(record),
        "num_steps": record.num_steps,
        "num_chunks": record.num_chunks,
        "codec": codec,
        "digest": episode_digest(record),
    }


def corrupt(path, problem: str) -> CorruptEpisode:
    """A :class:`CorruptEpisode` whose one-line message names the file and the problem."""
    return CorruptEpisode(f"{path}: {problem}")


def record_from_parts(path, meta: dict, tables: dict[str, dict[str, np.ndarray]], where: str = "") -> EpisodeRecord:
    """Rebuild and verify an episode read from ``path`` (``where``: the part of the file, for messages).

    Raises:
        CorruptEpisode: wrong format or version, missing fields, bad shapes, or a digest mismatch.
    """
    at = f"{where}: " if where else ""
    if meta.get("format") != FORMAT_NAME:
        raise corrupt(path, f"{at}format {meta.get('format')!r}, expected {FORMAT_NAME!r}; not a rollcap recording")
    if meta.get("format_version") != FORMAT_VERSION:
        raise corrupt(
            path,
            f"{at}format version {meta.get('format_version')!r}, this rollcap reads version {FORMAT_VERSION}; "
            "read it with the rollcap release that wrote it",
        )
    missing = [k for k in (*SCALARS, "num_steps", "num_chunks", "digest") if k not in meta]
    if missing:
        raise corrupt(path, f"{at}meta lacks {missing}")
    record = EpisodeRecord(**{k: meta[k] for k in SCALARS}, **{t: tables.get(t, {}) for t in TABLES})
    try:
        record.validate()
    except (ValueError, KeyError) as err:
        raise corrupt(path, f"{at}{err}") from err
    if (record.num_steps, record.num_chunks) != (meta["num_steps"], meta["num_chunks"]):
        raise corrupt(
            path,
            f"{at}{record.num_steps} steps / {record.num_chunks} chunks, "
            f"meta says {meta['num_steps']} / {meta['num_chunks']}",
        )
    try:
        digest = episode_digest(record)
    except (TypeError, ValueError) as err:
        raise corrupt(path, f"{at}meta holds a value of the wrong type ({err})") from err
    if digest != meta["digest"]:
        raise corrupt(path, f"{at}content digest mismatch: the data was altered or damaged after writing")
    return record


def fsync_dir(directory) -> None:
    """fsync a directory so a rename / create / unlink in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` on a temp file beside ``path``, fsync it, then rename it into place.

    A crash at any moment leaves either the old ``path`` (or none) or the whole
    new one, plus at most a stray ``.<name>.*.tmp`` file that
    :func:`remove_stale_temps` deletes.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def remove_stale_temps(directory) -> list[Path]:
    """Delete temp files a crash left behind in ``directory``; return them."""
    stale = sorted(Path(directory).glob(".*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def write_npz(record: EpisodeRecord, path) -> None:
    """Write ``record`` to ``path`` atomically (see the module docstring for the keys).

    Raises:
        ValueError: the record cannot be recorded exactly (see :func:`check_record`).
    """
    check_record(record)
    images = any(is_image(a) for a in record.obs.values())
    meta = episode_meta(record, NPZ_DEFLATE if images else NPZ_STORED)
    arrays = {"meta.json": np.frombuffer(dumps(meta).encode(), dtype=np.uint8)}
    arrays.update(iter_fields(record))
    # np.savez_compressed's format, at deflate level 1: 2.5x faster than its level 6 on camera frames
    mode = dict(compression=zipfile.ZIP_DEFLATED, compresslevel=1) if images else dict(compression=zipfile.ZIP_STORED)

    def write(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", allowZip64=True, **mode) as zf:
            for name, a in arrays.items():
                with zf.open(f"{name}.npy", "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, a, allow_pickle=False)

    atomic_write(path, write)


def read_npz(path) -> EpisodeRecord:
    """Read and verify one episode written by :func:`write_npz`.

    Raises:
        CorruptEpisode: truncated, damaged, not an npz, a missing key or another format version.
        FileNotFoundError: ``path`` does not exist.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such episode file")
    try:
        z = np.load(path, allow_pickle=False)
        if not hasattr(z, "files"):
            raise corrupt(path, "holds a single array, not a rollcap episode archive")
        with z:
            if "meta.json" not in z.files:
                raise corrupt(path, "no 'meta.json' key; not a rollcap episode")
            meta = json.loads(bytes(z["meta.json"]).decode())
            if not isinstance(meta, dict):
                raise corrupt(path, "meta.json is not a JSON object")
            tables: dict[str, dict[str, np.ndarray]] = {t: {} for t in TABLES}
            for name in z.files:
                table, _, key = name.partition("/")
                if name == "meta.json":
                    continue
                if table not in tables or not key:
                    raise corrupt(path, f"unexpected key {name!r}")
                tables[table][key] = z[name]
    except CorruptEpisode:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise corrupt(path, f"damaged or truncated archive ({err})") from err
    except (ValueError, OSError, KeyError, UnicodeDecodeError) as err:
        raise corrupt(path, f"not a readable npz episode ({type(err).__name__}: {err})") from err
    return record_from_parts(path, meta, tables)
