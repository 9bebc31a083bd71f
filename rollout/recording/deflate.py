"""Image frames deflated once for both formats: one compression serves the npz member and the HDF5 chunks.

Both formats store camera frames deflated: npz as one zip member per array
(raw deflate of the ``.npy`` bytes), HDF5 as one chunk per frame through its
deflate filter (a zlib stream each). Compressing every frame twice was a third
of the writer's CPU. :func:`frames` compresses each frame once, at level 1, as
a *full-flush segment*: a run of deflate blocks that starts with an empty
history and ends on a byte boundary, so segments can be concatenated into one
stream or wrapped alone:

- the npz member is the ``.npy`` header's segment, every frame's segment and
  an empty final block (:func:`npz_member`), its CRC-32 over the header and
  the array's bytes;
- an HDF5 chunk is one frame's segment in a zlib wrapper: header, segment,
  final block, the frame's Adler-32 (:func:`zlib_chunk`), exactly what
  ``inflate`` (HDF5's filter, robomimic's reads through h5py) reads back.

Decoding is standard deflate in both cases: nothing here changes what a
reader sees, only that the bytes are compressed once. Encodings are kept for
the last arrays seen (:data:`KEEP`; by object identity, checked alive), so a
recorder that writes an episode's npz and then its HDF5 demo compresses its
frames once without passing anything between the two.

Imports point downward: numpy and zlib only.
"""

from __future__ import annotations

import threading
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

LEVEL = 1
"""Deflate level of image frames in both formats (level 1: 2-3x faster than 4-6 on camera frames)."""
_ZLIB_HEAD = b"\x78\x01"  # deflate, 32 KiB window, level 0-1, no dictionary
_FINAL = b"\x03\x00"  # an empty final block with fixed codes: ends a stream of full-flush segments
KEEP = 32
"""Image arrays whose encodings are kept (an episode holds a few; the recorder writes its formats back to back)."""


@dataclass(frozen=True)
class Frames:
    """One image stack ``[T, H, W, C]`` deflated frame by frame."""

    segments: tuple[bytes, ...]
    """Each frame's full-flush deflate segment."""
    adler: tuple[int, ...]
    """Each frame's Adler-32 (the zlib trailer of its HDF5 chunk)."""


_kept: dict[int, tuple[weakref.ref, Frames]] = {}
_lock = threading.Lock()


def frames(a: np.ndarray) -> Frames:
    """``a`` (uint8 ``[T, ...]``, C-contiguous) deflated frame by frame; the last :data:`KEEP` arrays' are reused."""
    key = id(a)
    with _lock:
        hit = _kept.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    c = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    out = Frames(tuple(c.compress(f) + c.flush(zlib.Z_FULL_FLUSH) for f in a), tuple(zlib.adler32(f) for f in a))
    with _lock:
        while len(_kept) >= KEEP:
            del _kept[next(iter(_kept))]  # the oldest
        _kept[key] = (weakref.ref(a), out)
    return out


def zlib_chunk(f: Frames, i: int) -> bytes:
    """Frame ``i`` as a zlib stream: what HDF5's deflate filter stores for a one-frame chunk."""
    return _ZLIB_HEAD + f.segments[i] + _FINAL + f.adler[i].to_bytes(4, "big")


def compressor():
    """A raw deflate compressor at :data:`LEVEL` whose :func:`member` calls each make a stream of their own."""
    return zlib.compressobj(LEVEL, zlib.DEFLATED, -15)


def member(c, *parts) -> bytes:
    """``parts`` (bytes-like) as one whole raw deflate stream, made with ``c`` (a :func:`compressor`, reused: a full
    flush makes the stream independent of what ``c`` compressed before, and setting up a compressor costs ~30 us)."""
    return b"".join([c.compress(q) for q in parts] + [c.flush(zlib.Z_FULL_FLUSH), _FINAL])


def npz_member(c, header: bytes, a: np.ndarray) -> tuple[bytes, int]:
    """``(raw deflate stream, CRC-32)`` of the ``.npy`` member ``header`` + ``a``'s bytes (``a`` C-contiguous): the
    header compressed with ``c`` (see :func:`member`), then the frames' own segments."""
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    return b"".join((head, *frames(a).segments, _FINAL)), zlib.crc32(a, zlib.crc32(header))
