"""Files that survive crashes, and canonical JSON: the one helper for each, for every layer.

- :func:`atomic_write`: write a file beside its destination, fsync it, rename
  it into place, fsync the directory. A crash at any moment leaves the old
  file (or none) or the whole new one, plus at most a stray ``.<name>.*.tmp``
  that :func:`remove_stale_temps` deletes. The file gets the permissions any
  other file the user writes gets (``0o666`` less the umask) unless a mode is
  given.
- :func:`canonical_json`: sorted keys, compact separators, UTF-8 text (not
  ``\\u`` escapes), numpy scalars and arrays as plain numbers and lists. Equal
  values give equal strings, so the string can be hashed.
- :func:`plain_json`: a value as JSON gives it back (tuples become lists,
  numpy values plain Python), for comparing and storing JSON-able metadata.

Checkpoints (``kernels.checkpoint``), disk capsules (``capsule.disk``) and
recordings (``rollout.recording``) all use these. This module is at the bottom
of the import graph: it imports nothing of rollcap.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TEMP_SUFFIX = ".tmp"
"""Suffix of :func:`atomic_write`'s temp files (named ``.<name>.<random>.tmp``)."""


# --------------------------------------------------------------------------- fsync and atomic writes


def _fsync(path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path) -> None:
    """fsync a written file's data and metadata to disk."""
    _fsync(path)


def fsync_dir(directory) -> None:
    """fsync a directory so a rename / create / unlink in it survives a power cut."""
    _fsync(directory, os.O_DIRECTORY)


def _create_temp(path: Path) -> Path:
    """A new empty file beside ``path``; created with ``0o666`` so the umask applies as for any file."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"{path.parent}: no free temp file name for {path.name} after 100 tries")


def atomic_write(path, write: Callable[[str], None], mode: int | None = None) -> None:
    """Call ``write(tmp_path)`` on a temp file beside ``path``, fsync it, then rename it into place.

    ``write`` receives the temp file's path (it exists, empty) and may reopen
    or truncate it. On any exception, Ctrl-C included, the temp file is removed
    and ``path`` is left as it was.

    Args:
        path: the destination; its directory must exist.
        write: fills the temp file.
        mode: the file's permission bits; ``None``: ``0o666`` less the umask,
            like any other file the user creates.
    """
    path = Path(path)
    tmp = _create_temp(path)
    try:
        write(str(tmp))
        if mode is not None:
            os.chmod(tmp, mode)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def cannot_create_dir(path) -> str | None:
    """Why directory ``path`` could not be made here (None: it exists, or it and its missing parents can be created).

    Tries: makes the missing directories and removes them again at once, so it leaves nothing behind; a cheap
    check to run before minutes of work that end by writing there.
    """
    path = Path(path)
    missing = []
    for p in (path, *path.parents):
        if p.is_dir():
            break
        if p.exists() or p.is_symlink():
            return f"{p} is not a directory"
        missing.append(p)
    try:
        for p in reversed(missing):
            p.mkdir()
    except OSError as err:
        return f"{path} cannot be created ({err.strerror or err})"
    finally:
        for p in missing:
            try:
                p.rmdir()
            except OSError:
                pass
    if not missing and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None


def remove_stale_temps(directory) -> list[Path]:
    """Delete the temp files a crash inside :func:`atomic_write` left in ``directory``; return them."""
    stale = sorted(Path(directory).glob(f".*{TEMP_SUFFIX}"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


# --------------------------------------------------------------------------- canonical JSON


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable; use plain numbers, strings, lists and dicts")


def canonical_json(obj: Any, *, allow_nan: bool = True, indent: int | None = None) -> str:
    """``obj`` as canonical JSON: sorted keys, no spaces, UTF-8 text, numpy values as plain numbers / lists.

    Args:
        obj: a JSON-able value (dicts, lists, tuples, str, numbers, bool, None, numpy values).
        allow_nan: write NaN / Infinity (not strict JSON); ``False`` raises ``ValueError`` on them.
        indent: pretty-print for files people read (still sorted; separators ``","`` and ``": "``).

    Raises:
        TypeError: a value JSON cannot hold.
        ValueError: NaN or infinity with ``allow_nan=False``, or a circular reference.
    """
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(
        obj,
        sort_keys=True,
        separators=separators,
        ensure_ascii=False,
        allow_nan=allow_nan,
        indent=indent,
        default=_json_default,
    )


def sealed_digest(obj: dict, seal: str, *, allow_nan: bool = True) -> str:
    """``sha256:`` over the canonical JSON of every field of ``obj`` but ``seal`` (where the digest itself is stored)."""
    import hashlib

    rest = {k: v for k, v in obj.items() if k != seal}
    return "sha256:" + hashlib.sha256(canonical_json(rest, allow_nan=allow_nan).encode()).hexdigest()


def plain_json(obj: Any, *, allow_nan: bool = True) -> Any:
    """``obj`` as JSON gives it back: ``json.loads(canonical_json(obj))`` (tuples as lists, numpy as Python)."""
    return json.loads(canonical_json(obj, allow_nan=allow_nan))


def report_json(obj: Any, indent: int | None = 2) -> str:
    """Canonical JSON for a report people and other tools read (``summary.json``, ``branch.json``,
    ``calibration.json``): a NaN or infinite number (a figure with nothing to take it from: no critic, one sample) is
    written ``null``, since strict JSON readers (``jq``, JavaScript, Go) refuse ``NaN`` and ``Infinity``."""

    def finite(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        return [finite(v) for v in x] if isinstance(x, list) else x

    return canonical_json(finite(plain_json(obj)), allow_nan=False, indent=indent)


def write_report(path, obj: Any) -> None:
    """``obj`` as :func:`report_json` (strict, indented) at ``path``, atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(report_json(obj)))
