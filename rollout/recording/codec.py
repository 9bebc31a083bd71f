"""The episode codec both recording formats share: names, meta, digest, checks, rebuild.

An :class:`EpisodeRecord` is stored as flat named arrays plus one meta dict.
Arrays are named ``<table>/<key>`` for the tables in :data:`TABLES`::

    initial_state/<k>    env.get_state() right after reset
    obs/<k>              [T, ...] observation before each step
    final_obs/<k>        observation after the last step
    steps/<k>            see episode.STEP_DTYPES
    chunks/<k>           see episode.CHUNK_DTYPES

The meta (:func:`episode_meta`) holds format, format_version, the JSON fields
of :data:`SCALARS` (index, seed, env_id, env_kwargs, instruction, stop_reason,
success, fingerprints, config), ``error`` only when the episode has one,
num_steps, num_chunks, the format's ``codec``, ``digest`` and
``timings_digest``, and ``control_period_s`` when the env told it (beside
the digest, like ``codec``: older episodes keep their digests). JSON is :func:`rollcap.kernels.files.canonical_json`.

``digest`` (:func:`episode_digest`) is an episode's identity: a SHA-256 over
the JSON fields and every array's name, dtype, shape and bytes, except the
wall-clock timings of :data:`TIMINGS` (per-chunk latencies). Everything it
covers is deterministic, so the same episode (same index, seed, config
and fingerprints) has the same digest across runs, across machines with the same
runner fingerprint, whatever the number of actors, and whether or not the run
was resumed; compare digests to tell whether two recordings hold the same
episode. ``timings_digest`` (:func:`timings_digest`) covers the timing arrays
alone. Readers recompute both (:func:`record_from_parts`), so a damaged file,
a flipped latency bit included, raises :class:`CorruptEpisode` and never
returns different data. Files written before ``timings_digest`` existed have
a ``digest`` over every field, timings included; they are verified that way
and still read.

Imports point downward: this module knows ``kernels.files``, ``episode`` and
``errors``; the format modules (``npz``, ``h5``) and the recorder build on it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import numpy as np

from rollcap.kernels.files import canonical_json, plain_json
from rollcap.rollout.episode import FORMAT_VERSION, EpisodeRecord
from rollcap.rollout.errors import CorruptEpisode

FORMAT_NAME = "rollcap.episode"
TABLES = ("initial_state", "obs", "final_obs", "steps", "chunks")
"""The dict-of-array fields of an :class:`EpisodeRecord`, in canonical order."""
SCALARS = ("index", "seed", "env_id", "env_kwargs", "instruction", "stop_reason", "success", "fingerprints", "config")
"""The JSON-able fields of an :class:`EpisodeRecord`, in canonical order (always stored)."""
OPTIONAL_SCALARS = ("error", "origin")
"""JSON-able fields stored (and digested) only when not None, so records without them keep their bytes."""
TIMINGS = ("chunks/latency_policy_s", "chunks/latency_critic_s", "chunks/latency_boundary_s")
"""Wall-clock fields: stored and integrity-checked (``timings_digest``) but not part of an episode's identity."""
_ARRAY_KINDS = "biufc"  # bool, int, uint, float, complex: no objects, no strings


def is_image(a: np.ndarray) -> bool:
    """True for a per-step image stack: uint8 with 4 dims ``[T, H, W, C]``."""
    return a.dtype == np.uint8 and a.ndim == 4


_PLAIN = (str, int, float, bool, type(None))  # JSON gives these back as they are


def scalar_meta(record: EpisodeRecord) -> dict:
    """The JSON-able fields of ``record`` as plain Python values (an optional one only when not None).

    Raises:
        ValueError: a field JSON cannot hold (named).
    """
    meta = {}
    for k in (*SCALARS, *OPTIONAL_SCALARS):
        v = getattr(record, k)
        if v is None and k in OPTIONAL_SCALARS:
            continue
        try:
            meta[k] = v if type(v) in _PLAIN else plain_json(v)
        except (TypeError, ValueError) as err:
            raise ValueError(f"episode {record.index}: {k} is not JSON-able: {err}") from err
    meta["index"], meta["seed"], meta["success"] = int(record.index), int(record.seed), bool(record.success)
    return meta


class EncodedMeta(dict):
    """A meta dict that carries each member's canonical JSON (``"key":value``), so the digest and both formats'
    archives compose its JSON from them (:func:`meta_json`) instead of encoding its nested values (the fingerprints:
    ~2 KB) three or four times an episode. Its values are the plain ones, as in any meta dict."""

    __slots__ = ("members",)

    def __init__(self, members: dict[str, str], values: dict):
        super().__init__(values)
        self.members = members

    def with_members(self, **more) -> EncodedMeta:
        """A copy with ``more`` added (or replaced), in the order a dict literal ``{**self, **more}`` has."""
        members = dict(self.members)
        members.update((k, _member(k, canonical_json(v))) for k, v in more.items())
        return EncodedMeta(members, {**self, **more})


def _member(key: str, text: str) -> str:
    """``"key":text``: one member of a dict's canonical JSON (``text``: the value's)."""
    return f"{json.dumps(key, ensure_ascii=False)}:{text}"


def meta_json(meta: dict) -> str:
    """``canonical_json(meta)``: composed from an :class:`EncodedMeta`'s members (the same text), else encoded."""
    members = getattr(meta, "members", None)
    if members is None:
        return canonical_json(meta)
    return "{" + ",".join(members[k] for k in sorted(meta)) + "}"


_LAST_PLAIN: dict[str, tuple[str, object]] = {}  # a JSON field's last canonical text and its plain value


def _encoded_scalar_meta(record: EpisodeRecord) -> EncodedMeta:
    """:func:`scalar_meta` with each member's JSON: a non-plain value (a dict: the fingerprints, the config) is encoded
    once, and its plain value taken from that text (the last one's again when the text is the same: an episode's
    fingerprints are its run's)."""
    values, members = {}, {}
    for k in (*SCALARS, *OPTIONAL_SCALARS):
        v = getattr(record, k)
        if v is None and k in OPTIONAL_SCALARS:
            continue
        if type(v) in _PLAIN:
            values[k], members[k] = v, _member(k, canonical_json(v))
            continue
        try:
            text = canonical_json(v)
        except (TypeError, ValueError) as err:
            raise ValueError(f"episode {record.index}: {k} is not JSON-able: {err}") from err
        last = _LAST_PLAIN.get(k)
        values[k] = last[1] if last is not None and last[0] == text else json.loads(text)
        _LAST_PLAIN[k] = (text, values[k])
        members[k] = _member(k, text)
    for k, v in (("index", int(record.index)), ("seed", int(record.seed)), ("success", bool(record.success))):
        values[k], members[k] = v, _member(k, canonical_json(v))
    return EncodedMeta(members, values)


def check_record(record: EpisodeRecord) -> None:
    """Raise ``ValueError`` if ``record`` cannot be recorded exactly (names, dtypes, lengths, JSON)."""
    _check_fields(record)
    scalar_meta(record)


def _check_fields(record: EpisodeRecord) -> None:
    """:func:`check_record` but for JSON."""
    record.validate()
    for table in TABLES:
        for k, a in getattr(record, table).items():
            if not isinstance(k, str) or not k or "/" in k or k != k.strip():
                raise ValueError(f"episode {record.index}: {table} key {k!r} must be a non-empty name without '/'")
            if not isinstance(a, np.ndarray) or a.dtype.kind not in _ARRAY_KINDS or a.dtype.fields is not None:
                what = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(
                    f"episode {record.index}: {table}[{k!r}] is {what}; record numeric or bool numpy arrays"
                )
    if record.error is not None and not isinstance(record.error, str):
        raise ValueError(f"episode {record.index}: error is {type(record.error).__name__}; record a str or None")
    if record.origin is not None and not isinstance(record.origin, dict):
        raise ValueError(f"episode {record.index}: origin is {type(record.origin).__name__}; record a dict or None")


def byte_view(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` in C order, as a flat uint8 array (no copy when already contiguous)."""
    return np.require(a, requirements="C").reshape(-1).view(np.uint8)


def iter_fields(record: EpisodeRecord) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``("<table>/<key>", array)`` for every array of ``record`` in canonical order."""
    for table in TABLES:
        arrays = getattr(record, table)
        for k in sorted(arrays):
            yield f"{table}/{k}", arrays[k]


def _digest(h, fields: Iterator[tuple[str, np.ndarray]]) -> str:
    for name, a in fields:
        _update(h, name, a)
    return "sha256:" + h.hexdigest()


def _update(h, name: str, a: np.ndarray) -> None:
    h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
    h.update(a.data if a.flags.c_contiguous else byte_view(a))  # (the same bytes: a buffer, without a uint8 view)


def _digests(record: EpisodeRecord, scalar: dict) -> tuple[str, str]:
    """``(episode_digest, timings_digest)`` in one pass over the fields (``scalar``: :func:`scalar_meta`)."""
    content, timings = hashlib.sha256(meta_json(scalar).encode()), hashlib.sha256()
    for name, a in iter_fields(record):
        _update(timings if name in TIMINGS else content, name, a)
    return "sha256:" + content.hexdigest(), "sha256:" + timings.hexdigest()


def episode_digest(record: EpisodeRecord) -> str:
    """An episode's identity: SHA-256 over the JSON fields and every array but :data:`TIMINGS`.

    Equal for two runs of the same episode (see the module docstring), so
    it names the episode's content, not one run of it.
    """
    h = hashlib.sha256(canonical_json(scalar_meta(record)).encode())
    return _digest(h, ((name, a) for name, a in iter_fields(record) if name not in TIMINGS))


def timings_digest(record: EpisodeRecord) -> str:
    """SHA-256 over the :data:`TIMINGS` arrays' names, dtypes, shapes and bytes (their integrity check)."""
    return _digest(hashlib.sha256(), ((name, a) for name, a in iter_fields(record) if name in TIMINGS))


def _legacy_digest(record: EpisodeRecord) -> str:
    """The ``digest`` of files without ``timings_digest``: every field, timings included (read-only use)."""
    return _digest(hashlib.sha256(canonical_json(scalar_meta(record)).encode()), iter_fields(record))


def checked_meta(record: EpisodeRecord) -> dict:
    """:func:`check_record`, then :func:`episode_meta` with ``codec`` None: what both formats store, digests
    included, computed once for a recorder that writes an episode in both (pass it as ``checked``).

    Raises:
        ValueError: as :func:`check_record`.
    """
    _check_fields(record)
    scalar = _encoded_scalar_meta(record)
    return _meta(record, None, *_digests(record, scalar), scalar)


def episode_meta(record: EpisodeRecord, codec, checked: dict | None = None) -> dict:
    """The meta dict stored with an episode in both formats (``checked``: :func:`checked_meta` of this record)."""
    if checked is not None:
        if isinstance(checked, EncodedMeta):
            return checked.with_members(codec=codec)
        return {**checked, "codec": codec}  # the key keeps its place
    return _meta(record, codec, episode_digest(record), timings_digest(record), scalar_meta(record))


def _meta(record: EpisodeRecord, codec, digest: str, timings: str, scalar: dict) -> dict:
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **scalar,
        "num_steps": record.num_steps,
        "num_chunks": record.num_chunks,
        "codec": codec,
        "digest": digest,
        "timings_digest": timings,
        **({} if record.control_period_s is None else {"control_period_s": float(record.control_period_s)}),
    }
    if isinstance(scalar, EncodedMeta):
        members = dict(scalar.members)
        members.update((k, _member(k, canonical_json(v))) for k, v in meta.items() if k not in members)
        return EncodedMeta(members, meta)
    return meta


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
    if not isinstance(meta.get("error"), (str, type(None))):
        raise corrupt(path, f"{at}meta error is {type(meta['error']).__name__}, expected a string")
    if not isinstance(meta.get("origin"), (dict, type(None))):
        raise corrupt(path, f"{at}meta origin is {type(meta['origin']).__name__}, expected an object")
    period = meta.get("control_period_s")
    if period is not None and (
        isinstance(period, (bool, str))
        or not isinstance(period, (int, float, np.floating))
        or not 0 < float(period) < float("inf")
    ):
        raise corrupt(path, f"{at}meta control_period_s is {period!r}, expected seconds > 0")
    record = EpisodeRecord(
        **{k: meta[k] for k in SCALARS},
        **{k: meta.get(k) for k in OPTIONAL_SCALARS},
        **{t: tables.get(t, {}) for t in TABLES},
        control_period_s=None if period is None else float(period),
    )
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
        if "timings_digest" in meta:
            digest, timings = episode_digest(record), timings_digest(record)
        else:  # written before timings_digest: digest covers every field
            digest, timings = _legacy_digest(record), None
    except (TypeError, ValueError) as err:
        raise corrupt(path, f"{at}meta holds a value of the wrong type ({err})") from err
    if digest != meta["digest"]:
        raise corrupt(path, f"{at}content digest mismatch: the data was altered or damaged after writing")
    if timings != meta.get("timings_digest"):
        raise corrupt(path, f"{at}timings digest mismatch: the latencies were altered or damaged after writing")
    return record
