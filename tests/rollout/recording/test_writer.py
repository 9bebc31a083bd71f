"""The writer's own mechanisms: frames deflated once for both formats, the zip written directly (zip64 where a size
needs it), a demo written through h5py's low-level calls as its high-level calls would write it, and demos of the layout before
``rollcap/fields`` still read."""

from __future__ import annotations

import io
from dataclasses import replace
import json
import time
import os
import zipfile
import zlib

import h5py
import numpy as np
import pytest

from rollcap.rollout.recording import H5Writer, read_h5_episode, read_npz, write_npz, deflate, npz
from rollcap.rollout.recording.codec import episode_meta, is_image, iter_fields
from rollcap.rollout.recording.h5 import IMAGE_CODEC
from rollcap.rollout.recording.h5read import ROBOMIMIC_STEP_KEYS, _JSON_ATTRS
from rollcap.rollout.recording.recorder import records_equal, synthetic_record

META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


@pytest.mark.parametrize("t", [6, 5, 1])
def test_a_chunk_segment_is_an_hdf5_chunk_and_part_of_the_npz_member(t, monkeypatch):
    """Each chunk's one compression decodes alone as a zlib stream (an HDF5 chunk: the last one padded with zero frames
    to a whole chunk) and, joined after the .npy header, as the whole member (raw deflate), with the member's CRC; an
    empty stack is the header alone."""
    monkeypatch.setattr(deflate, "CHUNK_BYTES", 3 * 8 * 8 * 3)  # 3 frames a chunk
    a = np.random.default_rng(t).integers(0, 16, (t, 8, 8, 3), dtype=np.uint8)
    f = deflate.frames(a)
    assert deflate.frames(a) is f  # kept: the HDF5 writer reuses what the npz writer compressed
    k = f.per_chunk
    assert k == min(3, t) and len(f.segments) == -(-t // k)
    padded = np.concatenate([a, np.zeros((len(f.segments) * k - t, 8, 8, 3), np.uint8)])
    assert [zlib.decompress(deflate.zlib_chunk(f, i)) for i in range(len(f.segments))] == [
        padded[i : i + k].tobytes() for i in range(0, len(padded), k)
    ]
    header = b"\x93NUMPY" + b" " * 58
    data, crc = deflate.npz_member(deflate.compressor(), header, a)
    d = zlib.decompressobj(-15)
    assert d.decompress(data) + d.flush() == header + a.tobytes() and d.eof and crc == zlib.crc32(header + a.tobytes())
    empty = np.zeros((0, 8, 8, 3), np.uint8)
    data, _ = deflate.npz_member(deflate.compressor(), header, empty)
    assert zlib.decompress(data, -15) == header


def test_hdf5_reads_image_chunks_across_the_padded_edge(tmp_path, monkeypatch):
    """An image stack of 7 frames in chunks of 3 reads back whole and frame by frame through h5py, and a frame
    appended through h5py's own calls (its deflate filter) lands after the padding."""
    monkeypatch.setattr(deflate, "CHUNK_BYTES", 3 * 16 * 16 * 3)
    rec = synthetic_record(2, steps=7, image_size=16)
    with H5Writer(tmp_path / "e.hdf5", META) as w:
        w.append(rec)
    img = rec.obs["agentview_image"]
    with h5py.File(tmp_path / "e.hdf5", "r+") as f:
        ds = f["data/demo_2/obs/agentview_image"]
        assert ds.chunks == (3, 16, 16, 3) and np.array_equal(ds[()], img)
        assert all(np.array_equal(ds[i], img[i]) for i in range(7))
        ds.resize(8, axis=0)
        ds[7] = img[0]
        assert np.array_equal(ds[()], np.concatenate([img, img[:1]]))


@pytest.mark.parametrize("zip64", [False, True])
def test_npz_archives_read_with_zipfile_and_numpy(zip64, tmp_path, monkeypatch):
    """An episode's npz (images and not, zip64 records forced for every size and count) passes zipfile's CRC check,
    reads back with np.load and with rollcap's reader, byte for byte."""
    if zip64:  # what a >2 GB member or a >65535-member archive gets: every branch, at a size a test can write
        monkeypatch.setattr(npz, "_ZIP64_LIMIT", 0)
        monkeypatch.setattr(npz, "_COUNT_LIMIT", 0)
    for rec in (synthetic_record(3), synthetic_record(4, steps=0), synthetic_record(5, image_size=0)):
        path = tmp_path / f"e{rec.index}.npz"
        write_npz(rec, path)
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None
            assert zf.infolist()[0].compress_type == (
                zipfile.ZIP_DEFLATED if any(map(is_image, rec.obs.values())) else zipfile.ZIP_STORED
            )
        with np.load(path, allow_pickle=False) as z:
            assert json.loads(z["meta.json"].tobytes())["digest"] == episode_meta(rec, None)["digest"]
        assert records_equal(read_npz(path), rec) is None


def _put(group, name, a, k=None):
    """``group.create_dataset`` as rollcap's writer means it: images in chunks of ``k`` whole frames (default: the
    writer's), deflated, growable."""
    image = is_image(a) and all(a.shape[1:])
    k = k or (deflate.frames_per_chunk(a) if image else None)
    kw = dict(chunks=(k, *a.shape[1:]), maxshape=(None, *a.shape[1:]), compression="gzip", compression_opts=4)
    group.create_dataset(name, data=a, track_times=False, **(kw if image else {}))


def _robomimic_part(data: h5py.Group, rec, k: int | None = None) -> h5py.Group:
    demo = data.create_group(f"demo_{rec.index}")
    demo.attrs["num_samples"] = rec.num_steps
    for key in ROBOMIMIC_STEP_KEYS:
        _put(demo, key, rec.steps[key])
    obs = demo.create_group("obs")
    for key, a in rec.obs.items():
        _put(obs, key, a, k)
    return demo


def _reference_demo(data: h5py.Group, rec) -> None:
    """The demo through h5py's high-level calls (the layout the fast writer must reproduce)."""
    rc = _robomimic_part(data, rec).create_group("rollcap")
    final = rc.create_group("final_obs")
    for k, a in rec.final_obs.items():
        _put(final, k, a)
    own = ("obs/", "final_obs/", *(f"steps/{k}" for k in ROBOMIMIC_STEP_KEYS))
    rest = [(n, a) for n, a in iter_fields(rec) if not n.startswith(own)]
    blob = b"".join(npz.archive(episode_meta(rec, IMAGE_CODEC), rest, deflate=False))
    rc.create_dataset("fields", data=np.frombuffer(blob, np.uint8), track_times=False)


def _expanded_demo(data: h5py.Group, rec) -> None:
    """A demo as rollcap wrote it before ``rollcap/fields``: one attribute a meta field, one dataset an array."""
    rc = _robomimic_part(data, rec, k=1).create_group("rollcap")  # then: one chunk a frame
    for k, v in episode_meta(rec, {"images": "deflate-1, one chunk per frame", "other": "contiguous"}).items():
        rc.attrs[k] = json.dumps(v) if k in _JSON_ATTRS else str(v) if k in ("index", "seed") else v
    for k, a in rec.steps.items():
        if k not in ROBOMIMIC_STEP_KEYS:
            _put(rc.require_group("steps"), k, a)
    for table in ("chunks", "initial_state", "final_obs"):
        sub = rc.create_group(table)
        for k, a in getattr(rec, table).items():
            _put(sub, k, a)


def _layout(obj) -> dict:
    """Every object under ``obj``: kind, dtype, shape, chunks, filter and level, values; attributes with their HDF5 types."""
    out = {}

    def visit(name, o):
        attrs = {k: (o.attrs.get_id(k).get_type().get_class(), str(o.attrs.get_id(k).dtype)) for k in o.attrs}
        if isinstance(o, h5py.Dataset):
            out[name] = (
                "dataset",
                o.dtype.str,
                o.shape,
                o.chunks,
                o.compression,
                o.compression_opts,
                o.maxshape,
                o[()].tobytes(),
                attrs,
            )
        else:
            out[name] = ("group", attrs)

    obj.visititems(visit)
    out["."] = ("group", {k: obj.attrs.get_id(k).get_type().get_class() for k in obj.attrs})
    return out


def test_a_demo_is_what_h5pys_own_calls_write(tmp_path, monkeypatch):
    """The low-level writer's demo has the datasets (dtypes, shapes, chunking, filter level, bytes), groups and
    attributes (HDF5 types: strings variable-length UTF-8, as h5py stores a str) of h5py's high-level calls, next_obs
    and masks aside; and reads back as the record."""
    now = time.localtime()  # both archives stamped with the same second (a zip member's time is part of its bytes)
    monkeypatch.setattr(npz.time, "localtime", lambda *a: now)
    rec = synthetic_record(7)
    w = H5Writer(tmp_path / "fast.hdf5", META)
    w.append(rec)
    with h5py.File(tmp_path / "ref.hdf5", "w") as f:
        _reference_demo(f.create_group("data"), rec)
    with h5py.File(tmp_path / "fast.hdf5") as fast, h5py.File(tmp_path / "ref.hdf5") as ref:
        got, want = _layout(fast["data/demo_7"]), _layout(ref["data/demo_7"])
        got = {k: v for k, v in got.items() if not k.startswith("next_obs")}
        assert got.keys() == want.keys() and got == want
    assert records_equal(read_h5_episode(tmp_path / "fast.hdf5", 7), rec) is None


def test_demos_written_before_fields_still_read_and_take_appends(tmp_path):
    """A file of expanded demos (every meta field an attribute, every array a dataset) reads back; a resumed writer
    appends packed demos beside them, and both kinds read as their records."""
    old, new = synthetic_record(3, image_size=16), synthetic_record(4, steps=0, image_size=16)
    path = tmp_path / "old.hdf5"
    with h5py.File(path, "w", libver=("v108", "v110")) as f:
        data = f.create_group("data")
        data.attrs["total"], data.attrs["env_args"] = old.num_steps, json.dumps(META)
        _expanded_demo(data, old)
    assert records_equal(read_h5_episode(path, 3), old) is None
    with H5Writer(path, resume=True) as w:
        w.append(new)
    with h5py.File(path) as f:
        assert "fields" not in f["data/demo_3/rollcap"] and "fields" in f["data/demo_4/rollcap"]
    assert [records_equal(read_h5_episode(path, r.index), r) for r in (old, new)] == [None, None]


def test_a_short_write_is_finished(tmp_path, monkeypatch):
    """writev returning early (a signal, a full pipe) leaves the rest to plain writes: the archive is whole, 0-d and
    bool arrays included."""
    rec = synthetic_record(6, steps=5, image_size=8)
    short = []

    def writev(fd, parts):
        short.append(len(parts))
        return os.write(fd, b"".join(parts)[:37])

    monkeypatch.setattr(os, "writev", writev)
    write_npz(rec, tmp_path / "e.npz")
    assert short and records_equal(read_npz(tmp_path / "e.npz"), rec) is None


@pytest.mark.parametrize("dtype", ["<f4", "<f8", "|u1", "|b1", "<i8", "<u8", "<c16", ">f4", "<f2"])
def test_npy_headers_are_numpys(dtype):
    """The writer's own .npy header is numpy's write_array_header_1_0, byte for byte, for every rank and size."""
    d = np.dtype(dtype)
    for shape in ((), (0,), (1,), (34, 28), (120, 64, 64, 3), (10**20,), (3, 0, 2), (7, 1, 1, 1, 1, 1)):
        want = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            want, {"descr": np.lib.format.dtype_to_descr(d), "fortran_order": False, "shape": shape}
        )
        assert npz._npy_header(d, shape) == want.getvalue(), shape


@pytest.mark.parametrize("engine", ["isal", "zlib"])
def test_either_deflate_writes_what_every_reader_reads(engine, tmp_path, monkeypatch):
    """ISA-L's deflate and the standard library's (the fallback where isal's wheel is missing) write archives and
    HDF5 chunks that zipfile, numpy, h5py and rollcap's readers read back byte for byte."""
    if engine == "zlib":
        monkeypatch.setattr(deflate, "_z", zlib)
    elif deflate.ENGINE != "isal":
        pytest.skip("isal is not installed (pip install isal)")
    rec = synthetic_record(8, steps=23, image_size=32)
    write_npz(rec, tmp_path / "e.npz")
    with H5Writer(tmp_path / "e.hdf5", META) as w:
        w.append(rec)
    with zipfile.ZipFile(tmp_path / "e.npz") as zf:
        assert zf.testzip() is None
    with np.load(tmp_path / "e.npz", allow_pickle=False) as z:
        assert np.array_equal(z["obs/agentview_image"], rec.obs["agentview_image"])
    with h5py.File(tmp_path / "e.hdf5") as f:
        assert np.array_equal(f["data/demo_8/obs/agentview_image"][()], rec.obs["agentview_image"])
    assert records_equal(read_npz(tmp_path / "e.npz"), rec) is None
    assert records_equal(read_h5_episode(tmp_path / "e.hdf5", 8), rec) is None


def test_a_meta_composed_from_its_members_is_its_canonical_json():
    """The digest and both archives compose the meta's JSON from each member's (encoded once): the same text as
    encoding the whole meta, the same digest as :func:`episode_digest`, whatever the values (unicode, NaN, nesting,
    tuples, numpy numbers, the optional fields), and a field's plain value reused only for the same text."""
    from rollcap.kernels.files import canonical_json
    from rollcap.rollout.recording.codec import checked_meta, episode_digest, meta_json

    base = synthetic_record(3, steps=4, image_size=8)
    odd = replace(
        base,
        instruction='pousse le bloc \u00e9 \u2192 "l\u00e0"',
        fingerprints={"policy": {"w": "sha256:00", "dims": (3, np.int64(4)), "nan": float("nan")}, "\u00e9": [1.5]},
        config={"b": 1, "a": [True, None, 2.0]},
        error="boom \u2603",
        origin={"branch_of": 2, "at": np.float32(0.5)},
    )
    again = replace(odd, fingerprints={**odd.fingerprints, "env": {"other": 1}})  # same key, other text
    for rec in (base, odd, again, odd):
        checked = checked_meta(rec)
        assert checked["digest"] == episode_digest(rec)
        for codec in (None, "deflate-1", IMAGE_CODEC):
            meta = episode_meta(rec, codec, checked)
            assert meta == json.loads(canonical_json(episode_meta(rec, codec)))  # the plain values
            assert meta_json(meta) == canonical_json(episode_meta(rec, codec))
