"""Reading rollcap's robomimic HDF5 (:mod:`rollcap.rollout.recording.h5` writes it): the committed view, an
episode's arrays (sizes bounded before anything is inflated), the indices and the env metadata.

Imports point downward: this module knows ``episode``, ``errors``, ``codec`` and ``journal``.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np

from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording.codec import corrupt, record_from_parts
from rollcap.rollout.recording.journal import committed_view
from rollcap.rollout.recording.npz import read_archive

ROBOMIMIC_STEP_KEYS = ("actions", "rewards", "dones", "states")
"""Per-step arrays stored where robomimic looks for them; the rest of STEP_DTYPES are in ``rollcap/fields`` (in
``rollcap/steps`` in demos written before it)."""
FIELDS = "fields"
"""``data/demo_<index>/rollcap/fields``: the archive of the meta and the fields a demo keeps in no dataset of its own."""


def in_own_dataset(name: str) -> bool:
    """Whether the field ``name`` (``<table>/<key>``) is a dataset of its own in a demo (robomimic's, final_obs), not
    a member of :data:`FIELDS`."""
    table, _, key = name.partition("/")
    return table in ("obs", "final_obs") or (table == "steps" and key in ROBOMIMIC_STEP_KEYS)


_JSON_ATTRS = ("env_kwargs", "fingerprints", "config", "codec", "origin")
_DEMO = re.compile(r"demo_(\d+)")
_MAX_INFLATE = 1100  # deflate expands at most ~1032x: a gzip dataset's bytes bound its size


@contextmanager
def _open_committed(path, lock_timeout_s: float) -> Iterator[h5py.File]:
    """``path`` opened read-only as of its last commit."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such HDF5 file")
    with committed_view(path, lock_timeout_s) as view:
        try:
            f = h5py.File(view, "r")
        except (OSError, ValueError) as err:
            raise corrupt(path, f"not a readable HDF5 file ({err})") from err
        with f:
            try:
                yield f
            except (OSError, RuntimeError) as err:
                raise corrupt(path, f"damaged HDF5 structure ({err})") from err


def _load(path, group: h5py.Group, key: str, rows: int | None = None) -> np.ndarray:
    """``group[key]`` read whole, once its declared size is one the file can hold (``rows``: its length).

    A damaged header can declare a huge shape over no data; reading it would
    allocate that much, so the size is checked against the bytes stored first.
    """
    ds, where = group.get(key), f"{group.name}/{key}".lstrip("/")
    if not isinstance(ds, h5py.Dataset):
        raise KeyError(f"{where} is {'missing' if ds is None else 'not a dataset'}")
    if rows is not None and (ds.ndim == 0 or ds.shape[0] != rows):
        raise corrupt(path, f"{where}: shape {ds.shape}, expected {rows} rows")
    declared, stored = math.prod(ds.shape) * ds.dtype.itemsize, ds.id.get_storage_size()
    held = stored * (_MAX_INFLATE if ds.id.get_create_plist().get_nfilters() else 1)
    if declared > held or stored > ds.file.id.get_filesize():
        raise corrupt(
            path, f"{where}: declares shape {ds.shape} ({declared:,} bytes) over {stored:,} stored bytes; damaged"
        )
    return np.asarray(ds[()])


def _arrays(path, group: h5py.Group, rows: int | None = None) -> dict[str, np.ndarray]:
    return {k: _load(path, group, k, rows) for k in group}


def _read_demo(path, f: h5py.File, index: int) -> EpisodeRecord:
    where = f"data/demo_{index}"
    try:
        demo = f[where]
        if "rollcap" not in demo:
            raise corrupt(path, f"{where} has no 'rollcap' group; not written by rollcap")
        rc = demo["rollcap"]
        meta, tables = _packed(path, rc, where) if FIELDS in rc else _expanded(path, rc)
        n = meta.get("num_steps")
        if int(demo.attrs.get("num_samples", -1)) != n:
            raise corrupt(path, f"{where}: num_samples {demo.attrs.get('num_samples')} != num_steps {n}")
        tables["steps"].update({k: _load(path, demo, k, n) for k in ROBOMIMIC_STEP_KEYS})
        tables["obs"] = _arrays(path, demo["obs"], n)
        tables["final_obs"] = _arrays(path, rc["final_obs"])
    except CorruptEpisode:
        raise
    except (KeyError, OSError, ValueError, TypeError, RuntimeError) as err:
        raise corrupt(path, f"{where}: {err}") from err
    return record_from_parts(path, meta, tables, where)


def _packed(path, rc: h5py.Group, where: str) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """The meta and the fields kept in ``rollcap/fields`` (the archive :func:`~rollcap.rollout.recording.npz.archive`
    makes); a field also stored as a dataset of its own is refused."""
    blob = _load(path, rc, FIELDS)
    at = f"{path}: {where}/rollcap/{FIELDS}"
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise corrupt(path, f"{where}/rollcap/{FIELDS} is {blob.dtype}{blob.shape}, expected uint8 bytes")
    meta, tables = read_archive(at, io.BytesIO(blob.tobytes()), blob.nbytes)
    twice = [f"{t}/{k}" for t, arrays in tables.items() for k in arrays if in_own_dataset(f"{t}/{k}")]
    if twice:
        raise corrupt(at, f"holds {twice[0]}, which the demo stores as a dataset")
    return meta, tables


def _expanded(path, rc: h5py.Group) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """The meta and the rollcap tables of a demo written before ``rollcap/fields``: one attribute a meta field, one
    dataset an array."""
    meta = {}
    for k, v in rc.attrs.items():
        v = v.decode() if isinstance(v, bytes) else v
        meta[k] = json.loads(v) if k in _JSON_ATTRS else int(v) if k in ("index", "seed") else v
    for k in ("format_version", "num_steps", "num_chunks"):
        if k in meta:
            meta[k] = int(meta[k])
    if "success" in meta:
        meta["success"] = bool(meta["success"])
    return meta, {
        "steps": _arrays(path, rc["steps"], meta.get("num_steps")),
        "chunks": _arrays(path, rc["chunks"], meta.get("num_chunks")),
        "initial_state": _arrays(path, rc["initial_state"]),
    }


def _indices(path, f: h5py.File) -> list[int]:
    try:
        if "data" not in f:
            raise corrupt(path, "no 'data' group; not a robomimic-layout file")
        return sorted(int(m.group(1)) for k in f["data"] if (m := _DEMO.fullmatch(k)))
    except (KeyError, OSError, RuntimeError, ValueError) as err:
        raise corrupt(path, f"unreadable 'data' group ({err})") from err


def _env_args(path, f: h5py.File) -> dict:
    try:
        return json.loads(f["data"].attrs["env_args"])
    except (KeyError, ValueError, TypeError) as err:
        raise corrupt(path, f"data.attrs['env_args'] missing or not JSON ({err})") from err


# --------------------------------------------------------------------------- public API


def h5_indices(path, lock_timeout_s: float = 60.0) -> list[int]:
    """The committed demo indices of ``path``, sorted."""
    with _open_committed(path, lock_timeout_s) as f:
        return _indices(path, f)


def read_h5_episode(path, index: int, lock_timeout_s: float = 60.0) -> EpisodeRecord:
    """Read and verify ``data/demo_<index>`` of ``path``.

    Raises:
        CorruptEpisode: damaged, not HDF5, not rollcap's, or another format version.
        KeyError: no such demo.
    """
    with _open_committed(path, lock_timeout_s) as f:
        indices = _indices(path, f)
        if index not in indices:
            raise KeyError(f"{path}: no demo_{index}; it holds {indices}")
        return _read_demo(path, f, index)


def read_h5(path, lock_timeout_s: float = 60.0) -> list[EpisodeRecord]:
    """Every committed episode of ``path``, by index (one short shared lock per episode)."""
    return [read_h5_episode(path, i, lock_timeout_s) for i in h5_indices(path, lock_timeout_s)]
