"""Episodes of a run in one HDF5 file, robomimic's layout, appended atomically.

Layout (robomimic's, so its readers work; rollcap's extras in their own group)::

    data.attrs: total (sum of num_samples), env_args (JSON {"env_name", "type", "env_kwargs"})
    data/demo_<index>.attrs: num_samples
    data/demo_<index>/{actions, rewards, dones, states}          [T, ...]
    data/demo_<index>/obs/<key>                                   [T, ...]
    data/demo_<index>/next_obs/<key>                              [T, ...] virtual
    mask/{success, failure, intervened, train, valid}             [n] demo names (bytes)
    data/demo_<index>/rollcap/final_obs/<key>                     the observation after the last step
    data/demo_<index>/rollcap/fields                              uint8 [n]: an npz archive, stored

``rollcap/fields`` holds the rest of the episode as the ``.npz`` file does (:func:`~rollcap.rollout.recording.npz.archive`):
``meta.json`` (the meta of :mod:`rollcap.rollout.recording.codec`: format, version, index, seed, env, instruction,
success, fingerprints, config, digests, ...), ``steps/{terminated, truncated, actor}``, ``chunks/<key>`` and
``initial_state/<key>``. ``np.load(io.BytesIO(demo["rollcap/fields"][()]))`` opens it. One archive instead of a
dataset per array and an attribute per meta field makes a PushBlock demo 17 HDF5 objects instead of 54, which was most of
the writer's time (each costs tens of microseconds inside HDF5). Demos written before it (``rollcap`` a group of
``steps``, ``chunks``, ``initial_state`` and ``final_obs`` groups, the meta as its attributes) still read.

Images (uint8, ndim 4) are chunked in whole frames, about 128 KiB a chunk
(:func:`~rollcap.rollout.recording.deflate.frames_per_chunk`: 10 frames of 64x64 RGB, one of 224x224), and deflated
(level 1; compressed once for both formats: :mod:`~rollcap.rollout.recording.deflate`); everything else is
contiguous. The deflate filter names level 4 (what HDF5 uses if it compresses a chunk itself, e.g. one appended
through h5py); rollcap deflates its own chunks at level 1 (the meta's ``codec`` says so).

``next_obs`` and ``mask`` are derived data for robomimic's readers (its offline-RL
algorithms read ``next_obs``; ``filter_by_attribute`` reads ``mask``); rollcap's
readers ignore them and the digest does not cover them. ``next_obs/<k>[t]`` is
``obs/<k>[t + 1]`` and, for the last step, ``rollcap/final_obs/<k>`` (or
``obs/<k>[T - 1]`` again when the episode has no final frame of that key, shape and
dtype). Each is an HDF5 virtual dataset over those two sources in the same file
(source file ``"."``), so it stores no array bytes and survives copying or renaming
the file. Copying one demo group elsewhere with ``h5py`` keeps the absolute source
paths (``/data/demo_<index>/...``), which there name another demo or nothing
(HDF5 2.0 raises; older versions may return the fill value, zeros): copy whole
files, or write ``next_obs[()]`` out as real datasets. Filter keys (:data:`MASKS`): ``success`` / ``failure`` by the
episode's label, ``intervened`` when any step's actor is not the policy, and
``train`` / ``valid`` by :func:`demo_split` (demos with at least one step:
robomimic's SequenceDataset asserts on an empty one). Appending a demo updates
them in the same commit; the first append to a file written before they existed
derives them for every demo.

``digest`` (the episode's identity) and ``timings_digest`` together cover every
field, so a damaged demo raises :class:`CorruptEpisode` instead of returning
different data. Before reading a dataset, readers check its declared shape
against ``num_samples`` / ``num_chunks`` and the bytes the file stores for it,
so a damaged header declaring a huge shape is :class:`CorruptEpisode` too, not
a ``MemoryError``.

Atomicity: every append goes through :mod:`rollcap.rollout.recording.journal`, a
rollback journal under h5py's ``fileobj`` driver (see there for why and how): a
crash, SIGKILL, SIGINT or full disk at any moment leaves the file as of the last
commit, whole episodes or none, earlier demos untouched. One writer per file.

Imports point downward: this module knows ``kernels.files``, ``episode``,
``errors``, ``codec``, ``deflate``, ``journal`` and ``h5read`` (the reading half).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np

from rollcap.rollout.errors import ConfigError
from rollcap.kernels.files import atomic_write, canonical_json, plain_json
from rollcap.rollout.episode import ACTOR_POLICY, EpisodeRecord
from rollcap.rollout.recording.codec import check_record, episode_meta, is_image, iter_fields
from rollcap.rollout.recording.deflate import frames, zlib_chunk
from rollcap.rollout.recording.h5read import (
    FIELDS,
    ROBOMIMIC_STEP_KEYS,
    _env_args,
    _indices,
    _open_committed,
    _read_demo,
    h5_indices,
    in_own_dataset,
)
from rollcap.rollout.recording.journal import JournaledFile, recover
from rollcap.rollout.recording.npz import archive

IMAGE_CODEC = {"images": "deflate-1, chunks of whole frames", "other": "contiguous", "fields": "npz, stored"}
_LIBVER = ("v108", "v110")  # readable by every HDF5 >= 1.10; dense attributes allowed
MASKS = ("success", "failure", "intervened", "train", "valid")
"""robomimic filter keys kept under ``mask/``; see the module docstring."""
_MASK_ROWS, _MASK_WIDTH = 64, 32  # chunk length (2 KiB: an append rewrites one chunk), the first width of names


def recover_h5(path, lock_timeout_s: float = 60.0) -> bool:
    """Roll ``path`` back to its last commit if a killed writer left a journal; True if it did."""
    return recover(path, lock_timeout_s)


# --------------------------------------------------------------------------- layout
# A demo is ~30 datasets, ~8 groups and ~17 attributes: written through h5py's low-level calls with their types,
# spaces and property lists made once (h5py's high-level layer spends ~0.1 ms of Python on each), the same objects
# ``group.create_dataset(name, data=a)``, ``create_group`` and ``attrs[name] = value`` make
# (``tests/rollout/recording/test_robomimic.py`` compares them).

_CACHE: dict[tuple, object] = {}


def _made(key: tuple, make):
    """``make()``, once per ``key`` (types, dataspaces, property lists: read-only once made)."""
    value = _CACHE.get(key)
    if value is None:
        if len(_CACHE) > 4096:  # shapes vary with episode lengths: bounded
            _CACHE.clear()
        value = _CACHE[key] = make()
    return value


def _dcpl(chunk: tuple[int, ...] | None, early: bool = False) -> h5py.h5p.PropDCID:
    """The creation properties of a contiguous array (``chunk`` None) or an image stack stored in ``chunk``-shaped
    chunks of whole frames (deflate: :mod:`~rollcap.rollout.recording.deflate` compresses them): no times stored,
    attribute order not tracked. ``early``: a contiguous array's storage allocated when it is created, never filled
    (its bytes are written straight to the file: :func:`_put`)."""

    def make():
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        if chunk is not None:
            plist.set_chunk(chunk)
            plist.set_deflate(4)  # the level HDF5 uses if it compresses a chunk itself; deflate.LEVEL is ours
        if early:
            plist.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            plist.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        plist.set_obj_track_times(False)
        plist.set_attr_creation_order(0)
        return plist

    return _made(("dcpl", chunk, early), make)


def _lcpl() -> h5py.h5p.PropLCID:
    """Link names in UTF-8, as h5py's high-level layer makes them."""

    def make():
        plist = h5py.h5p.create(h5py.h5p.LINK_CREATE)
        plist.set_char_encoding(h5py.h5t.CSET_UTF8)
        return plist

    return _made(("lcpl",), make)


def _type(dtype: np.dtype) -> h5py.h5t.TypeID:
    return _made(("type", dtype.str), lambda: h5py.h5t.py_create(dtype, logical=1))


def _memory_type(dtype: np.dtype) -> h5py.h5t.TypeID:
    """The type h5py writes an array of ``dtype`` with (it makes one at every write unless given)."""
    return _made(("memory", dtype.str), lambda: h5py.h5t.py_create(dtype))


def _space(shape: tuple[int, ...], maxshape: tuple | None = None) -> h5py.h5s.SpaceID:
    return _made(("space", shape, maxshape), lambda: h5py.h5s.create_simple(shape, maxshape))


def _scalar() -> h5py.h5s.SpaceID:
    return _made(("scalar",), lambda: h5py.h5s.create(h5py.h5s.SCALAR))


def _group(parent: h5py.h5g.GroupID, name: str) -> h5py.h5g.GroupID:
    """``parent.create_group(name)``."""
    return h5py.h5g.create(parent, name.encode(), lcpl=_lcpl())


def _put(group: h5py.h5g.GroupID, name: str, a: np.ndarray, file=None) -> None:
    """``create_dataset(name, data=a)`` (images: chunks of whole frames, deflated, growable): image chunks are written
    as :func:`~rollcap.rollout.recording.deflate.frames` compressed them (once for both formats). Given ``file`` (the
    file object HDF5 has open), a contiguous array's bytes are written to it at the dataset's address instead of
    through HDF5's write path (its file type is the array's own dtype, so the bytes are the same; ~60 us a dataset
    less)."""
    a = np.require(a, requirements="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    f = frames(a) if is_image(a) and all(a.shape[1:]) else None
    if a.ndim == 0:
        space = _scalar()
    else:
        space = _space(a.shape, (h5py.h5s.UNLIMITED, *a.shape[1:]) if f else None)
    direct = file is not None and not f and a.size > 0
    dcpl = _dcpl((f.per_chunk, *a.shape[1:]) if f else None, early=direct)
    dset = h5py.h5d.create(group, name.encode(), _type(a.dtype), space, dcpl=dcpl, lcpl=_lcpl())
    if f:
        at = [0] * a.ndim
        for i in range(len(f.segments)):
            at[0] = i * f.per_chunk
            dset.write_direct_chunk(tuple(at), zlib_chunk(f, i))
    elif direct:
        file.seek(dset.get_offset())
        file.write(a)
    elif a.size:
        dset.write(h5py.h5s.ALL, h5py.h5s.ALL, a, mtype=_memory_type(a.dtype))


def _attr(obj: h5py.h5g.GroupID, name: str, value) -> None:
    """``attrs[name] = value`` for a str, int, float or bool (a str as h5py stores it: variable-length UTF-8)."""
    if isinstance(value, str):
        arr, key = np.array(value, dtype=h5py.string_dtype()), "str"
    else:
        arr = np.asarray(value)
        key = arr.dtype.str
    logical, memory = _made(
        ("attr", key), lambda: (h5py.h5t.py_create(arr.dtype, logical=True), h5py.h5t.py_create(arr.dtype))
    )
    h5py.h5a.create(obj, name.encode(), logical, _space(())).write(arr, mtype=memory)


def _write_demo(data: h5py.h5g.GroupID, record: EpisodeRecord, checked: dict | None, file) -> None:
    """``data/demo_<index>``: robomimic's datasets, ``rollcap/final_obs`` (next_obs's last rows point there) and the
    rest of the episode in ``rollcap/fields``, one stored archive, so a demo is a dozen HDF5 objects, not fifty.
    ``file``: the file object HDF5 has open (see :func:`_put`)."""
    demo = _group(data, f"demo_{record.index}")
    _attr(demo, "num_samples", record.num_steps)
    for k in ROBOMIMIC_STEP_KEYS:
        _put(demo, k, record.steps[k], file)
    obs = _group(demo, "obs")
    for k, a in record.obs.items():
        _put(obs, k, a, file)
    rc = _group(demo, "rollcap")
    final = _group(rc, "final_obs")
    for k, a in record.final_obs.items():
        _put(final, k, a, file)
    rest = [(name, a) for name, a in iter_fields(record) if not in_own_dataset(name)]
    parts = archive(episode_meta(record, IMAGE_CODEC, checked), rest, deflate=False)
    _put(rc, FIELDS, np.frombuffer(b"".join(parts), np.uint8), file)
    nxt, at = _group(demo, "next_obs"), f"/data/demo_{record.index}"
    for k, a in record.obs.items():
        last = record.final_obs.get(k)
        last = None if last is None else (f"{at}/rollcap/final_obs/{k}", last.shape, last.dtype)
        _put_next_obs(nxt, k, f"{at}/obs/{k}", a.shape, a.dtype, last)


def _write_next_obs(demo: h5py.Group) -> None:
    """``demo/next_obs/<k>`` of a demo written before rollcap kept them: virtual datasets over ``obs/<k>[1:]`` and
    the final frame (no array bytes)."""
    nxt = demo.create_group("next_obs")
    final = demo["rollcap/final_obs"] if "rollcap/final_obs" in demo else {}
    for k, ob in demo["obs"].items():
        last = final.get(k)
        last = None if last is None else (last.name, last.shape, last.dtype)
        _put_next_obs(nxt.id, k, ob.name, ob.shape, ob.dtype, last)


def _rows(shape: tuple[int, ...], start: int, count: int) -> h5py.h5s.SpaceID:
    """A dataspace of ``shape`` selecting rows ``start .. start + count - 1`` (made once: ``set_virtual`` copies it)."""

    def make():
        space = h5py.h5s.create_simple(shape)
        space.select_hyperslab((start, *(0 for _ in shape[1:])), (count, *shape[1:]))
        return space

    return _made(("rows", shape, start, count), make)


def _put_next_obs(
    nxt: h5py.h5g.GroupID, k: str, obs: str, shape: tuple[int, ...], dtype: np.dtype, last: tuple | None
) -> None:
    """``nxt/<k>``: the virtual dataset over the dataset ``obs`` (rows 1..T-1) and ``last`` (``(path, shape, dtype)``
    of the final frame; used when it is one frame of ``obs``) that ``h5py.VirtualLayout`` builds, through h5py's
    low-level calls (its selection objects cost ~0.5 ms a key)."""
    if 0 in shape:  # an empty dataset (no frames: nothing to map)
        h5py.h5d.create(nxt, k.encode(), _type(np.dtype(dtype)), _space(tuple(shape)), dcpl=_dcpl(None), lcpl=_lcpl())
        return
    t, plist = shape[0], h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    plist.set_layout(h5py.h5d.VIRTUAL)
    if t > 1:
        plist.set_virtual(_rows(shape, 0, t - 1), b".", obs.encode(), _rows(shape, 1, t - 1))
    if last is not None and last[1] == shape[1:] and last[2] == dtype:
        source = _space(last[1]) if last[1] else _scalar()
        plist.set_virtual(_rows(shape, t - 1, 1), b".", last[0].encode(), source)
    else:
        plist.set_virtual(_rows(shape, t - 1, 1), b".", obs.encode(), _rows(shape, t - 1, 1))
    h5py.h5d.create(nxt, k.encode(), _type(np.dtype(dtype)), _space(tuple(shape)), dcpl=plist, lcpl=_lcpl())


def demo_split(index: int) -> str:
    """``"valid"`` for about 1 demo in 10, else ``"train"``: by the SHA-256 of ``demo_<index>``, so fixed per index."""
    h = hashlib.sha256(f"demo_{index}".encode()).digest()
    return "valid" if int.from_bytes(h[:8], "big") % 10 == 0 else "train"


def _filter_keys(index: int, num_steps: int, success: bool, actor: np.ndarray | None) -> list[str]:
    keys = ["success" if success else "failure"]
    if actor is not None and np.any(actor != ACTOR_POLICY):
        keys.append("intervened")
    return keys + [demo_split(index)] if num_steps else keys


def _stored_filter_keys(path, f: h5py.File, index: int) -> list[str]:
    r = _read_demo(path, f, index)
    return _filter_keys(index, r.num_steps, r.success, r.steps.get("actor"))


def _append_names(f: h5py.File, key: str, names: list[bytes], opened: dict) -> None:
    """Append ``names`` to ``mask/<key>`` (created if missing; rebuilt wider for a longer name). ``opened`` keeps the
    masks open from one append to the next (their last chunk stays in HDF5's chunk cache: not read again)."""
    width = max((len(n) for n in names), default=0)
    old = opened.get(key)
    if old is not None:
        if width <= old.dtype.itemsize:  # the common case, through the low-level calls (~0.3 ms a mask less)
            if names:
                n, arr = old.shape[0], np.array(names, old.dtype)
                old.set_extent((n + len(names),))
                rows = old.get_space()
                rows.select_hyperslab((n,), (len(names),))
                old.write(h5py.h5s.create_simple((len(names),)), rows, arr, mtype=_memory_type(arr.dtype))
            return
        mask = f["mask"]
        kept = list(mask[key][()])
        del opened[key]
        old.close()
        del mask[key]
        names = kept + names
    f["mask"].create_dataset(
        key, data=np.array(names, f"S{max(width, _MASK_WIDTH)}"), maxshape=(None,), chunks=(_MASK_ROWS,)
    )


def _update_derived(path, f: h5py.File, records: list[EpisodeRecord], opened: dict) -> None:
    """Add ``records``' (written) demos to ``mask/``, each mask extended once; a file lacking any mask gets them,
    and next_obs, for every other demo first. ``opened``: the masks open in ``f`` (see :func:`_append_names`)."""
    names: dict[str, list[bytes]] = {k: [] for k in MASKS}
    missing = []
    if len(opened) < len(MASKS):  # (once per open file: then they are all open)
        mask = f.require_group("mask")
        for k in MASKS:
            if k in opened:
                continue
            if k.encode() in mask.id:
                opened[k] = h5py.h5d.open(mask.id, k.encode())
            else:
                missing.append(k)
    if missing:  # the first append, or a file written before rollcap kept next_obs and masks
        data, new = f["data"], {r.index for r in records}
        for i in _indices(path, f):
            if i in new:
                continue
            if "next_obs" not in data[f"demo_{i}"]:
                _write_next_obs(data[f"demo_{i}"])
            for k in set(_stored_filter_keys(path, f, i)) & set(missing):
                names[k].append(f"demo_{i}".encode())
    for record in records:
        for k in _filter_keys(record.index, record.num_steps, record.success, record.steps.get("actor")):
            names[k].append(f"demo_{record.index}".encode())
    for k in MASKS:
        if names[k] or k in missing:  # (a mask nothing joins is not opened)
            _append_names(f, k, names[k], opened)


def _refuse_other_env(path: Path, stored: dict, env_meta: dict) -> None:
    """An append of another env's episodes: naming the option that differs (as a resumed run's check does)."""
    for key, option in (("env_name", "env_id"), ("env_kwargs", "env_kwargs"), ("type", "env_id")):
        if stored.get(key) != env_meta.get(key):
            was, got = (canonical_json(d.get(key)) if key != "env_name" else d.get(key) for d in (stored, env_meta))
            raise ConfigError(
                option, f"{path} was recorded with {option} {was}; `resume=True` needs the same, got {got}"
            )
    raise ConfigError("env_id", f"{path}: env_meta {canonical_json(env_meta)} differs from the file's env_args")


class H5Writer:
    """Appends episodes to one robomimic-layout HDF5 file; each append is atomic.

    Single-threaded. Every :meth:`append` is one journaled update that ends with the file flushed and
    committed, so nothing is at risk between episodes. The writer keeps the file open in HDF5 from one append
    to the next (its B-trees, heaps and the masks stay in memory: ~2 ms an append less than reopening the file),
    through a view that lets nothing reach the disk between appends; if anything else changed the file meanwhile
    (another writer, a recovery), the next append reopens it. :meth:`close` closes it.

    Args:
        path: the ``.hdf5`` file.
        env_meta: robomimic's env metadata ``{"env_name", "type", "env_kwargs"}``,
            stored as ``data.attrs["env_args"]``; needed to create the file, checked
            against the file on resume (``None``: take the file's).
        resume: continue an existing file (rolling back a crashed append first).
            Without it an existing file is refused.
        lock_timeout_s: how long a commit waits for readers' locks.
    """

    def __init__(self, path, env_meta: dict | None = None, resume: bool = False, lock_timeout_s: float = 60.0):
        self.path, self._timeout, self._closed = Path(path), lock_timeout_s, False
        self._updates = JournaledFile(self.path, lock_timeout_s)
        self._file: h5py.File | None = None  # open over ``self._view`` from one append to the next
        self._view = None
        self._masks: dict[str, h5py.h5d.DatasetID] = {}  # open in ``self._file``
        if self.path.exists():
            if not resume:
                raise FileExistsError(f"{self.path} exists; pass resume=True to append to it")
            recover_h5(self.path, lock_timeout_s)
            with _open_committed(self.path, lock_timeout_s) as f:
                stored, self._indices = _env_args(self.path, f), set(_indices(self.path, f))
            if env_meta is not None and plain_json(env_meta) != stored:
                _refuse_other_env(self.path, stored, plain_json(env_meta))
            self.env_meta = stored
        else:
            if env_meta is None:
                raise ValueError(f"{self.path}: env_meta is required to create a new file")
            missing = {"env_name", "type", "env_kwargs"} - set(env_meta)
            if missing:
                raise ValueError(f"env_meta lacks {sorted(missing)}; robomimic expects env_name, type and env_kwargs")
            self.env_meta, self._indices = plain_json(env_meta), set()

            def create(tmp: str) -> None:
                with h5py.File(tmp, "w", libver=_LIBVER) as f:
                    data = f.create_group("data")
                    data.attrs["total"] = 0
                    data.attrs["env_args"] = canonical_json(self.env_meta)

            atomic_write(self.path, create)

    @property
    def indices(self) -> list[int]:
        """Indices of the demos in the file, sorted."""
        return sorted(self._indices)

    def append(self, record: EpisodeRecord, checked: dict | None = None) -> None:
        """Write ``record`` as ``data/demo_<index>``: all of it, or (on any error or crash) none.

        Args:
            checked: :func:`~rollcap.rollout.recording.codec.checked_meta` of ``record``, when the caller has it.

        Raises:
            ValueError: the index is already in the file, or the record cannot be recorded exactly.
        """
        self.append_many([record], None if checked is None else [checked])

    def append_many(self, records: list[EpisodeRecord], checked: list[dict] | None = None) -> None:
        """Write several episodes in one commit: all of them, or (on any error or crash) none.

        One journaled update (one open, one set of fsyncs, the masks extended once per demo) for
        the lot: a writer that has fallen behind catches up by appending what waits in one go.

        Raises:
            ValueError: an index is already in the file or repeated, or a record cannot be recorded exactly.
        """
        if self._closed:
            raise RuntimeError(f"{self.path}: append() after close()")
        if checked is None:
            for record in records:
                check_record(record)
        indices = [r.index for r in records]
        clash = sorted({i for i in indices if i in self._indices or indices.count(i) > 1})
        if clash:
            raise ValueError(f"{self.path}: demo_{clash[0]} exists; episode indices must be unique")
        if not records:
            return

        def update(view) -> None:
            f = self._open(view)
            data = f["data"]
            for k, record in enumerate(records):
                _write_demo(data.id, record, None if checked is None else checked[k], view)
            _update_derived(self.path, f, records, self._masks)  # the first commit also derives older demos' masks
            total = h5py.h5a.open(data.id, b"total")
            value = np.empty((), total.dtype)
            total.read(value)
            total.write(np.asarray(int(value) + sum(r.num_steps for r in records), total.dtype))
            f.flush()

        try:
            self._updates.update(update)
        except BaseException:
            self._drop()  # rolled back: HDF5's memory of this append must go too
            try:  # a Ctrl-C that arrives just after the commit still leaves the demos committed
                self._indices = set(h5_indices(self.path, self._timeout))
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
            raise
        self._indices.update(indices)

    def _open(self, view) -> h5py.File:
        """The file open over ``view``: the one kept from the last append when the update kept its view."""
        if self._file is None or view is not self._view:
            self._drop()
            self._file, self._view = h5py.File(view, "r+", libver=_LIBVER), view
        return self._file

    def _drop(self) -> None:
        """Forget the open file without writing: its view is parked (or rolled back), so its close reaches nothing."""
        f, self._file, self._view = self._file, None, None
        self._masks.clear()
        if f is not None:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - a parked view refuses its I/O; the file is as last committed
                pass

    def close(self) -> None:
        """Close the file (HDF5's close, in one last journaled update) and refuse further appends."""
        if self._closed:
            return
        self._closed = True
        if self._file is not None:

            def shut(view) -> None:
                if view is self._view:
                    self._masks.clear()
                    self._file.close()
                    self._file = None

            try:
                self._updates.update(shut)
            finally:
                self._drop()
        self._updates.close()

    def __enter__(self) -> H5Writer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
