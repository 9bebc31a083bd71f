"""One episode per ``.npz`` file.

Keys are the codec's flat names (see :mod:`rollcap.rollout.recording.codec`)
plus ``meta.json``, a uint8 array of the UTF-8 canonical JSON meta; the file
is readable with ``np.load(path, allow_pickle=False)``. The archive is
``np.savez_compressed``'s format; files holding images (uint8, ndim 4) are
deflated at level 1 (``codec: "deflate-1"``), others stored (``"stored"``).
The archive is built whole in memory and written at once (:func:`_zip`: a
zip's records written directly, zipfile's own layout, zip64 where a size
needs it), and image members reuse the frames the HDF5 writer compresses
too (:mod:`~rollcap.rollout.recording.deflate`): a few hundred microseconds
of CPU beside the compression, where zipfile took ~80 per member.
Writes go through :func:`rollcap.kernels.files.atomic_write`: a crash leaves
the old file (or none) or the whole new one. Reads never unpickle and never
trust a size: each ``.npy`` header is checked against its zip member's size,
and each member against the file's, before an array is allocated.

Imports point downward: this module knows ``kernels.files``, ``episode``,
``errors``, ``codec`` and ``deflate``.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import time
import tokenize
import zipfile
import zlib
from collections.abc import Iterable
from typing import BinaryIO

import numpy as np

from rollcap.kernels.files import atomic_write
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording.codec import (
    TABLES,
    check_record,
    corrupt,
    episode_meta,
    is_image,
    iter_fields,
    meta_json,
    record_from_parts,
)
from rollcap.rollout.recording.deflate import compressor, crc32, member, npz_member

NPZ_DEFLATE, NPZ_STORED = "deflate-1", "stored"
"""``meta.json``'s ``codec``: image-bearing files are deflated (level 1), others stored."""
DEFLATE_MIN = 512
"""Arrays smaller than this many bytes are stored even in a deflated archive (deflate would save a few bytes of each
at the cost of a compressor flush, most of the writer's time on them)."""
_NPZ_NAME = re.compile(r"episode_(\d+)\.npz")


def npz_name_index(path) -> int | None:
    """The episode index an ``episode_NNNNN.npz`` file name gives, ``None`` for another name."""
    m = _NPZ_NAME.fullmatch(os.path.basename(path))
    return int(m.group(1)) if m else None


def write_npz(record: EpisodeRecord, path, checked: dict | None = None) -> None:
    """Write ``record`` to ``path`` atomically (see the module docstring for the keys).

    Args:
        checked: :func:`~rollcap.rollout.recording.codec.checked_meta` of ``record``, when the caller has it
            (a recorder writing both formats checks and digests an episode once).

    Raises:
        ValueError: the record cannot be recorded exactly (see :func:`check_record`).
    """
    if checked is None:
        check_record(record)
    images = any(is_image(a) for a in record.obs.values())
    meta = episode_meta(record, NPZ_DEFLATE if images else NPZ_STORED, checked)
    parts = archive(meta, iter_fields(record), deflate=images)

    def write(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            for k in range(0, len(parts), _IOV_MAX):  # one system call for a few hundred parts
                some = parts[k : k + _IOV_MAX]
                done, want = os.writev(fd, some), sum(memoryview(q).nbytes for q in some)
                if done < want:  # a short write (a signal, a full pipe): the rest one part at a time
                    rest = memoryview(b"".join(some))[done:]
                    while rest:
                        rest = rest[os.write(fd, rest) :]
        finally:
            os.close(fd)

    atomic_write(path, write)


def archive(meta: dict, fields: Iterable[tuple[str, np.ndarray]], deflate: bool) -> list:
    """The parts (bytes-like) of an episode archive: ``meta.json`` (``meta`` as canonical JSON) and one ``.npy`` member
    per ``(name, array)`` of ``fields``, in that order. ``deflate``: image stacks (their frames' shared segments) and
    arrays of at least :data:`DEFLATE_MIN` bytes are deflated at level 1, the rest stored (a small array gains a few
    bytes from deflate and costs a compressor flush); else every member is stored. The HDF5 writer keeps an episode's
    other fields in such an archive too (stored)."""
    c = compressor() if deflate else None
    members = [("meta.json.npy", *_member(np.frombuffer(meta_json(meta).encode(), dtype=np.uint8), c))]
    members += [(f"{name}.npy", *_member(a, c)) for name, a in fields]
    return _zip(members)


def _member(a: np.ndarray, c) -> tuple[list, int, int, int, int]:
    """One ``.npy`` member (``np.lib.format.write_array``'s bytes): ``(data parts, method, CRC-32, size, stored size)``;
    deflated with ``c`` (a :func:`~rollcap.rollout.recording.deflate.compressor`) unless it is None or the array is
    small (stored); image frames as their shared segments. Arrays are parts as they are (their buffers)."""
    if not a.flags.c_contiguous:  # (a 0-d array always is: np.ascontiguousarray would make it 1-d)
        a = np.ascontiguousarray(a)
    header = _npy_header(a.dtype, a.shape)
    size = len(header) + a.nbytes
    if c is not None and is_image(a):
        data, crc = npz_member(c, header, a)
        return [data], zipfile.ZIP_DEFLATED, crc, size, len(data)
    crc = crc32(a, crc32(header))
    if c is None or a.nbytes < DEFLATE_MIN:
        return [header, a], zipfile.ZIP_STORED, crc, size, size
    data = member(c, header, a)
    return [data], zipfile.ZIP_DEFLATED, crc, size, len(data)


_HEADERS: dict[tuple, bytes] = {}


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """``np.lib.format.write_array_header_1_0``'s header of a C-ordered array, byte for byte (numpy formats it ~10x
    slower; kept per dtype and shape): the dict's text, room for the first axis to grow to 21 digits, spaces to a
    64-byte boundary and a newline."""
    key = (dtype.str, shape)
    header = _HEADERS.get(key)
    if header is None:
        text = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
        room = " " * (_GROWTH_DIGITS - len(repr(shape[0]))) if shape else ""
        raw = (text + room).encode("latin1")
        pad = _ALIGN - (len(_NPY_MAGIC) + 2 + len(raw) + 1) % _ALIGN
        header = _HEADERS[key] = _NPY_MAGIC + struct.pack("<H", len(raw) + 1 + pad) + raw + b" " * pad + b"\n"
        if len(_HEADERS) > 4096:
            _HEADERS.clear()
    return header


_NPY_MAGIC = b"\x93NUMPY\x01\x00"  # np.lib.format's magic, version 1.0
_ALIGN = 64  # np.lib.format.ARRAY_ALIGN
_GROWTH_DIGITS = 21  # np.lib.format.GROWTH_AXIS_MAX_DIGITS
_IOV_MAX = 1024
_LOCAL, _CENTRAL = (
    struct.Struct("<4s2B4HL2L2H"),
    struct.Struct("<4s4B4HL2L5H2L"),
)  # zipfile's structFileHeader, structCentralDir
_END, _END64, _LOCATOR = struct.Struct("<4s4H2LH"), struct.Struct("<4sQ2H2L4Q"), struct.Struct("<4sLQL")
_ZIP64_LIMIT, _COUNT_LIMIT = (1 << 31) - 1, (1 << 16) - 1  # zipfile's: beyond these, zip64 records
_UNIX_FILE = 0o600 << 16  # external attributes: a regular file (zipfile's default for writestr)


def _zip(members: list[tuple[str, list, int, int, int, int]]) -> list:
    """The parts of a zip archive of ``(name, data parts, method, crc, size, stored size)`` members: zipfile's layout
    (local headers, data, central directory, end records), zip64 extras and end record only where a size needs them."""
    t = time.localtime()
    dostime, dosdate = (
        t.tm_hour << 11 | t.tm_min << 5 | t.tm_sec // 2,
        (t.tm_year - 1980) << 9 | t.tm_mon << 5 | t.tm_mday,
    )
    parts, central, pos = [], [], 0
    for name, data, method, crc, size, csize in members:
        raw, flags = name.encode("utf-8"), 0 if name.isascii() else 0x800  # 0x800: the name is UTF-8
        if size > _ZIP64_LIMIT or csize > _ZIP64_LIMIT:
            extra = struct.pack("<2H2Q", 1, 16, size, csize)
            head = _LOCAL.pack(
                b"PK\x03\x04", 45, 0, flags, method, dostime, dosdate, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(raw), 20
            )
            parts += [head, raw, extra, *data]
        else:
            extra = b""
            head = _LOCAL.pack(b"PK\x03\x04", 20, 0, flags, method, dostime, dosdate, crc, csize, size, len(raw), 0)
            parts += [head, raw, *data]
        central.append((raw, flags, method, crc, csize, size, pos))
        pos += _LOCAL.size + len(raw) + len(extra) + csize
    start = pos
    for raw, flags, method, crc, csize, size, offset in central:
        big = size > _ZIP64_LIMIT or csize > _ZIP64_LIMIT
        wide = ([size, csize] if big else []) + ([offset] if offset > _ZIP64_LIMIT else [])
        extra = struct.pack("<2H" + "Q" * len(wide), 1, 8 * len(wide), *wide) if wide else b""
        version = 45 if wide else 20
        sizes = (0xFFFFFFFF, 0xFFFFFFFF) if big else (csize, size)
        head = _CENTRAL.pack(
            b"PK\x01\x02", version, 3, version, 0, flags, method, dostime, dosdate, crc, *sizes, len(raw), len(extra),
            0, 0, 0, _UNIX_FILE, 0xFFFFFFFF if offset > _ZIP64_LIMIT else offset,
        )  # fmt: skip
        parts += [head, raw, extra]
        pos += len(head) + len(raw) + len(extra)
    count, size_cd = len(central), pos - start
    if count > _COUNT_LIMIT or size_cd > _ZIP64_LIMIT or start > _ZIP64_LIMIT:
        parts.append(_END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size_cd, start))
        parts.append(_LOCATOR.pack(b"PK\x06\x07", 0, pos, 1))
        count, size_cd, start = min(count, 0xFFFF), min(size_cd, 0xFFFFFFFF), min(start, 0xFFFFFFFF)
    parts.append(_END.pack(b"PK\x05\x06", 0, 0, count, count, size_cd, start, 0))
    return parts


_NPY = ".npy"
_DEFLATE_MAX_RATIO = 1032
"""Deflate cannot expand a byte into more than 1032: a member claiming more is damaged (or a zip bomb)."""
_CHUNK = 1 << 24
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _member_problem(info: zipfile.ZipInfo, archive_size: int) -> str | None:
    """Why a zip member cannot be a rollcap array, from the central directory alone (nothing read)."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return f"zip compression method {info.compress_type}, expected stored (0) or deflate (8)"
    if info.flag_bits & 0x1:
        return "an encrypted zip member"
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO
    if info.compress_size > archive_size or info.file_size > info.compress_size * ratio + 64:
        return f"claims {info.file_size} bytes from {info.compress_size} compressed in a {archive_size}-byte file"
    return None


def _read_array(path, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member; its header is checked against the member's size before anything is allocated."""
    name = info.filename
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version not in _HEADER_READERS:
            raise corrupt(path, f"{name}: npy format version {version}, expected 1.0 or 2.0")
        try:
            shape, fortran, dtype = _HEADER_READERS[version](fh)
        except (ValueError, SyntaxError, tokenize.TokenError) as err:  # numpy tokenizes the header's Python literal
            raise corrupt(path, f"{name}: unreadable npy header ({type(err).__name__}: {err})") from err
        if dtype.hasobject or dtype.fields is not None or dtype.kind not in "biufc":
            raise corrupt(path, f"{name}: dtype {dtype.str}, expected numbers or bool")
        if any(d < 0 for d in shape):
            raise corrupt(path, f"{name}: negative shape {shape}")
        count = math.prod(shape)
        nbytes, held = count * dtype.itemsize, info.file_size - fh.tell()
        if nbytes != held:
            raise corrupt(
                path, f"{name}: header declares {dtype.str} {shape} ({nbytes} bytes), the archive holds {held}"
            )
        flat = np.empty(count, dtype)
        view, pos = memoryview(flat).cast("B"), 0
        while pos < nbytes:
            got = fh.readinto(view[pos : pos + _CHUNK])
            if not got:
                raise corrupt(path, f"{name}: ends after {pos} of {nbytes} bytes")
            pos += got
        if fh.read(1):  # also makes zipfile check the CRC
            raise corrupt(path, f"{name}: more bytes than its header declares")
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def _read_arrays(path, raw: BinaryIO, archive_size: int) -> dict[str, np.ndarray]:
    """Every ``.npy`` member of the archive ``raw`` (``archive_size`` bytes), by name without the suffix."""
    if raw.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
        raise corrupt(path, "holds a single array, not a rollcap episode archive")
    with zipfile.ZipFile(raw) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise corrupt(path, "a key appears twice in the archive")
        if sum(i.compress_size for i in infos) > archive_size:
            raise corrupt(path, f"members claim more than the archive's {archive_size} bytes")
        out = {}
        for info in infos:
            problem = _member_problem(info, archive_size)
            if problem is None and not info.filename.endswith(_NPY):
                problem = "not an .npy member"
            if problem is not None:
                raise corrupt(path, f"{info.filename}: {problem}")
            out[info.filename[: -len(_NPY)]] = _read_array(path, zf, info)
    return out


def read_archive(path, raw: BinaryIO, archive_size: int) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """``(meta, tables)`` of an episode archive (:func:`archive`'s layout) read from ``raw`` (``archive_size`` bytes;
    ``path`` names it in errors): sizes checked against what it holds before any array is allocated, nothing unpickled.

    Raises:
        CorruptEpisode: truncated, damaged, not an archive, no or a bad ``meta.json``, an unexpected key.
    """
    try:
        arrays = _read_arrays(path, raw, archive_size)
        meta = arrays.pop("meta.json", None)
        if meta is None:
            raise corrupt(path, "no 'meta.json' key; not a rollcap episode")
        if meta.dtype != np.uint8 or meta.ndim != 1:
            raise corrupt(path, f"meta.json is {meta.dtype}{meta.shape}, expected a uint8 byte string")
        meta = json.loads(meta.tobytes().decode())
        if not isinstance(meta, dict):
            raise corrupt(path, "meta.json is not a JSON object")
        tables: dict[str, dict[str, np.ndarray]] = {t: {} for t in TABLES}
        for name, a in arrays.items():
            table, _, key = name.partition("/")
            if table not in tables or not key:
                raise corrupt(path, f"unexpected key {name!r}")
            tables[table][key] = a
    except CorruptEpisode:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise corrupt(path, f"damaged or truncated archive ({err})") from err
    except (
        ValueError,
        OSError,
        KeyError,
        UnicodeDecodeError,
        NotImplementedError,
        RuntimeError,
        RecursionError,
    ) as err:
        raise corrupt(path, f"not a readable npz episode ({type(err).__name__}: {err})") from err
    return meta, tables


def read_npz(path, expect_index: int | None = None) -> EpisodeRecord:
    """Read and verify one episode written by :func:`write_npz` (see :func:`read_archive`).

    Args:
        path: the ``.npz`` file.
        expect_index: the episode index the caller expects (e.g. from the
            ``episode_NNNNN.npz`` name); another index is refused.

    Raises:
        CorruptEpisode: truncated, damaged, not an npz, a missing key, another
            format version, or another episode than ``expect_index``.
        FileNotFoundError: ``path`` does not exist.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such episode file")
    try:
        with open(path, "rb") as raw:
            meta, tables = read_archive(path, raw, os.fstat(raw.fileno()).st_size)
    except (IsADirectoryError, PermissionError) as err:
        raise corrupt(path, f"not a readable npz episode ({type(err).__name__}: {err})") from err
    record = record_from_parts(path, meta, tables)
    if expect_index is not None and record.index != expect_index:
        raise corrupt(
            path,
            f"holds episode {record.index}, expected episode {expect_index}; the file was renamed or copied over another",
        )
    return record
