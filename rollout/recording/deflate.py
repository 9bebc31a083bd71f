"""Image frames deflated once for both formats: one compression serves the npz member and the HDF5 chunks.

Both formats store camera frames deflated: npz as one zip member per array
(raw deflate of the ``.npy`` bytes), HDF5 as chunks of whole frames through its
deflate filter (a zlib stream each). Compressing every frame twice was a third
of the writer's CPU. :func:`frames` compresses each HDF5 chunk's frames once,
at level 1, as a *full-flush segment*: a run of deflate blocks that starts with
an empty history and ends on a byte boundary, so segments can be concatenated
into one stream or wrapped alone:

- the npz member is the ``.npy`` header's segment, every chunk's segment and
  an empty final block (:func:`npz_member`), its CRC-32 over the header and
  the array's bytes;
- an HDF5 chunk is its segment in a zlib wrapper: header, segment (the last
  chunk's followed by the segment of the zero frames HDF5 stores past the end
  of the data), final block, the chunk's Adler-32 (:func:`zlib_chunk`), exactly
  what ``inflate`` (HDF5's filter, robomimic's reads through h5py) reads back.

Decoding is standard deflate in both cases: nothing here changes what a
reader sees, only that the bytes are compressed once. Encodings are kept for
the last arrays seen (:data:`KEEP`; by object identity, checked alive), so a
recorder that writes an episode's npz and then its HDF5 demo compresses its
frames once without passing anything between the two.

Imports point downward: numpy, and ISA-L's zlib (``isal``) or the standard library's.
"""

from __future__ import annotations

import threading
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

try:  # Intel's ISA-L: the same deflate format, ~3x faster at level 1 on camera frames, CRC-32 and Adler-32 ~4x
    from isal import isal_zlib as _z

    ENGINE = "isal"
except ImportError:  # a platform without its wheel: the standard library's zlib, slower, the same format
    _z = zlib
    ENGINE = "zlib"
"""Which deflate the writer uses (``rollcap bench`` reports it beside the writer's CPU); readers inflate either."""
crc32 = _z.crc32

LEVEL = 1
"""Deflate level of image frames in both formats (level 1: 2-3x faster than 4-6 on camera frames)."""
_ZLIB_HEAD = b"\x78\x01"  # deflate, 32 KiB window, level 0-1, no dictionary
_FINAL = b"\x03\x00"  # an empty final block with fixed codes: ends a stream of full-flush segments
KEEP = 32
"""Image arrays whose encodings are kept (an episode holds a few; the recorder writes its formats back to back)."""


CHUNK_BYTES = 128 << 10
"""About how many bytes of frames an HDF5 chunk holds (whole frames, at least one): few enough that reading one
frame inflates little (robomimic reads a few frames around an index), many enough that a small camera's episode
is a few chunks, not one per frame (each chunk costs HDF5 an index entry and a write)."""


def frames_per_chunk(a: np.ndarray) -> int:
    """The frames in each HDF5 chunk of the image stack ``a`` ``[T, ...]``: :data:`CHUNK_BYTES` of them, at most T."""
    frame = max(1, a[0].nbytes if len(a) else 1)
    return max(1, min(len(a), CHUNK_BYTES // frame))


@dataclass(frozen=True)
class Frames:
    """One image stack ``[T, H, W, C]`` deflated a chunk of :attr:`per_chunk` frames at a time."""

    per_chunk: int
    """Frames per HDF5 chunk (:func:`frames_per_chunk`)."""
    segments: tuple[bytes, ...]
    """Each chunk's full-flush deflate segment (the last chunk's: its frames only)."""
    adler: tuple[int, ...]
    """Each HDF5 chunk's Adler-32 (the last one's over its frames padded with zeros to ``per_chunk`` frames)."""
    pad: bytes
    """The segment of the zero frames that fill the last HDF5 chunk (HDF5 stores edge chunks whole); ``b""``: none."""


_kept: dict[int, tuple[weakref.ref, Frames]] = {}
_lock = threading.Lock()


def frames(a: np.ndarray) -> Frames:
    """``a`` (uint8 ``[T, ...]``, C-contiguous) deflated chunk by chunk; the last :data:`KEEP` arrays' are reused."""
    key = id(a)
    with _lock:
        hit = _kept.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    c, k = compressor(), frames_per_chunk(a)
    slabs = [a[i : i + k] for i in range(0, len(a), k)]
    segments, adler = [c.compress(s) + c.flush(_z.Z_FULL_FLUSH) for s in slabs], [_z.adler32(s) for s in slabs]
    pad = b""
    if slabs and len(slabs[-1]) < k:
        zeros = bytes((k - len(slabs[-1])) * a[0].nbytes)
        pad, adler[-1] = c.compress(zeros) + c.flush(_z.Z_FULL_FLUSH), _z.adler32(zeros, adler[-1])
    out = Frames(k, tuple(segments), tuple(adler), pad)
    with _lock:
        while len(_kept) >= KEEP:
            del _kept[next(iter(_kept))]  # the oldest
        _kept[key] = (weakref.ref(a), out)
    return out


def zlib_chunk(f: Frames, i: int) -> bytes:
    """HDF5 chunk ``i`` (frames ``i * per_chunk`` on) as a zlib stream: what HDF5's deflate filter stores for it."""
    pad = f.pad if i == len(f.segments) - 1 else b""
    return b"".join((_ZLIB_HEAD, f.segments[i], pad, _FINAL, f.adler[i].to_bytes(4, "big")))


def compressor():
    """A raw deflate compressor at :data:`LEVEL` whose :func:`member` calls each make a stream of their own."""
    return _z.compressobj(LEVEL, _z.DEFLATED, -15)


def member(c, *parts) -> bytes:
    """``parts`` (bytes-like) as one whole raw deflate stream, made with ``c`` (a :func:`compressor`, reused: a full
    flush makes the stream independent of what ``c`` compressed before, and setting up a compressor costs ~30 us)."""
    return b"".join([c.compress(q) for q in parts] + [c.flush(_z.Z_FULL_FLUSH), _FINAL])


def npz_member(c, header: bytes, a: np.ndarray) -> tuple[bytes, int]:
    """``(raw deflate stream, CRC-32)`` of the ``.npy`` member ``header`` + ``a``'s bytes (``a`` C-contiguous): the
    header compressed with ``c`` (see :func:`member`), then the frames' own segments."""
    head = c.compress(header) + c.flush(_z.Z_FULL_FLUSH)
    return b"".join((head, *frames(a).segments, _FINAL)), crc32(a, crc32(header))
