"""The disk tier of capsules: a directory per capsule holding ``tensors.safetensors`` and ``manifest.json``.

The manifest holds metadata, fingerprints, per-buffer specs and digests, the overall digest, the format version,
and ``manifest_digest``: a SHA-256 over every other field, so an edited or damaged manifest is refused before
anything in it is trusted. Written into a temporary sibling directory, fsynced, then renamed into place: a crash
leaves the whole capsule or none of it (an interrupted write leaves a ``.NAME.tmp-*`` sibling, never a partial
capsule at ``NAME``). Never pickled: numpy arrays are stored as tensors with their kind recorded and come back as
numpy. Every dtype torch and safetensors share is stored (:data:`DISK_DTYPES`, the one table of their names); a
buffer of another dtype is refused before anything is written. :mod:`rollcap.capsule.tiers` moves capsules here.
"""

from __future__ import annotations

from __future__ import annotations
import json
import os
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import numpy as np
import safetensors
import safetensors.torch
import torch
from rollcap.capsule.capsule import Boundary, BufferInfo, Capsule, buffer_digest, carried_digest, combine_digests
from rollcap.capsule.errors import CorruptCapsule
from rollcap.capsule.protocol import StateValue
from rollcap.kernels.files import canonical_json, fsync_dir, fsync_file, sealed_digest

FORMAT = "rollcap-capsule"
FORMAT_VERSION = 2
"""2: the manifest carries ``manifest_digest``. Version 1 capsules (unsealed manifests) are refused."""
TENSORS_FILE = "tensors.safetensors"
MANIFEST_FILE = "manifest.json"
_META_DIGEST = "rollcap.capsule.digest"
_SEAL = "manifest_digest"
_SAFETENSORS_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu", "F4": "float4_e2m1fn_x2",
}  # fmt: skip
DISK_DTYPES: dict[str, str] = {
    st: name for st, name in _SAFETENSORS_NAMES.items() if isinstance(getattr(torch, name, None), torch.dtype)
}
"""The one table of dtype names of the disk tier: safetensors header name -> the name
:class:`BufferInfo` gives the dtype (torch's, which numpy shares for the numeric ones).

Every dtype torch (this version) and safetensors both have; a buffer of another dtype
(``complex128``, numpy ``longdouble``) is refused by :func:`save` before anything is
written. Numpy buffers are stored as the torch dtype of the same name and come back as numpy."""
_STORABLE = frozenset(DISK_DTYPES.values())
_PACKED = {"float4_e2m1fn_x2": 2}
"""Values per element of packed torch dtypes: safetensors counts the 4-bit values, so its
header's last dimension is this many times the tensor's (and it cannot store one 0-d)."""


def _header_shape(dtype: str, shape: tuple[int, ...]) -> list[int]:
    """The shape a safetensors header gives a buffer of ``dtype`` and ``shape``."""
    per = _PACKED.get(dtype, 1)
    return [*shape[:-1], shape[-1] * per] if shape and per > 1 else list(shape)


def _manifest_digest(manifest: dict) -> str:
    """sha256 over the canonical JSON of every manifest field but ``manifest_digest``."""
    return sealed_digest(manifest, _SEAL, allow_nan=False)


# -- copies ------------------------------------------------------------------------
def _as_cpu_tensor(value: StateValue) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        with warnings.catch_warnings():  # capsule arrays are read-only; safetensors only reads them
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(value)
    return value.detach().to("cpu").contiguous()


def _check_storable(capsule: Capsule) -> None:
    """Raise ``TypeError`` for the first buffer whose dtype the disk tier cannot hold (:data:`DISK_DTYPES`)."""
    for comp, infos in capsule.specs.items():
        for name, info in infos.items():
            if info.dtype not in _STORABLE:
                raise TypeError(
                    f"capsule buffer {comp}.{name} is {info.dtype} ({info.kind}), which the disk tier cannot store "
                    f"(safetensors holds {', '.join(sorted(_STORABLE))}); keep this capsule on the host tier, "
                    "or have the component expose the buffer as one of those dtypes"
                )
            if info.dtype in _PACKED and not info.shape:
                raise TypeError(
                    f"capsule buffer {comp}.{name} is a 0-d {info.dtype}, which safetensors cannot store (it counts the "
                    f"packed values along the last dimension); give the buffer shape (1,), or keep the capsule on the host tier"
                )


def save(capsule: Capsule, path: str | Path, *, overwrite: bool = False) -> Capsule:
    """Write the capsule as a directory at ``path``, atomically; returns its disk-tier handle.

    Args:
        capsule: an in-memory capsule (a disk one is loaded and copied).
        path: the capsule directory to create; its parent is created if needed.
        overwrite: replace an existing capsule at ``path`` (the old one stays
            whole until the new one is in place).
    """
    path = Path(path)
    if capsule.tier == "disk":
        if capsule.path is not None and capsule.path.resolve() == path.resolve():
            return capsule
        capsule = load(capsule.path, expect_digest=capsule.known_digest)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True or choose a new capsule path")
    _check_storable(capsule)
    per_buffer = capsule.buffer_digests()
    digest = combine_digests(per_buffer)
    tensors: dict[str, torch.Tensor] = {}
    components: dict[str, Any] = {}
    for comp, values in capsule.state.items():
        bufs = {}
        for name, v in values.items():
            key = f"{comp}/{name}"
            tensors[key] = _as_cpu_tensor(v)
            bufs[name] = {**capsule.specs[comp][name].to_json(), "key": key, "digest": per_buffer[comp][name]}
        components[comp] = {"fingerprint": dict(capsule.fingerprints[comp]), "buffers": bufs}
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tensors_file": TENSORS_FILE,
        "boundary": capsule.boundary.to_json(),
        "nbytes": capsule.nbytes,
        "digest": digest,
        "components": components,
        "writer": {"torch": torch.__version__, "numpy": np.__version__, "safetensors": safetensors.__version__},
    }
    manifest[_SEAL] = _manifest_digest(manifest)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=parent))
    try:
        os.chmod(tmp, 0o755)
        try:
            safetensors.torch.save_file(
                tensors, str(tmp / TENSORS_FILE), metadata={_META_DIGEST: digest, "format_version": str(FORMAT_VERSION)}
            )
        except KeyError as err:  # an older safetensors that lacks a dtype of DISK_DTYPES
            raise TypeError(
                f"safetensors {safetensors.__version__} cannot write dtype {err}; upgrade safetensors, or keep the capsule on the host tier"
            ) from err
        fsync_file(tmp / TENSORS_FILE)
        with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as f:
            f.write(canonical_json(manifest, allow_nan=False, indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        trash = None
        if path.exists():
            trash = parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, trash)
        os.replace(tmp, path)
        fsync_dir(parent)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Capsule(capsule.boundary, capsule.specs, capsule.fingerprints, "disk", None, path, known_digest=digest)


# -- disk: reading -----------------------------------------------------------------
@dataclass(frozen=True)
class Manifest:
    """A parsed, structurally checked ``manifest.json``."""

    path: Path
    boundary: Boundary
    specs: dict[str, dict[str, BufferInfo]]
    fingerprints: dict[str, dict]
    keys: dict[str, dict[str, str]]
    digests: dict[str, dict[str, str]]
    digest: str
    nbytes: int
    format_version: int
    raw: dict


def _corrupt(path: Path, what: str) -> CorruptCapsule:
    return CorruptCapsule(f"{path}: {what}", path=str(path))


def read_manifest(path: str | Path) -> Manifest:
    """Parse and check a capsule directory's manifest (no tensor bytes are read)."""
    path = Path(path)
    if not path.is_dir():
        raise _corrupt(
            path,
            "no capsule directory here; check the path (a capsule is a directory with manifest.json and tensors.safetensors)",
        )
    mpath = path / MANIFEST_FILE
    try:
        text = mpath.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _corrupt(path, f"{MANIFEST_FILE} is missing; the capsule is incomplete, write it again") from None
    except (OSError, UnicodeDecodeError) as err:
        raise _corrupt(path, f"{MANIFEST_FILE} is unreadable ({err}); write the capsule again") from err
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise _corrupt(
            path,
            f"{MANIFEST_FILE} is not valid JSON (truncated or edited? {err.msg} at line {err.lineno}); write the capsule again",
        ) from err
    except RecursionError as err:
        raise _corrupt(path, f"{MANIFEST_FILE} is not valid JSON (nested too deep); write the capsule again") from err
    _check_version_and_seal(path, raw)
    try:
        specs, fps, keys, digests = {}, {}, {}, {}
        if not isinstance(raw["components"], dict) or not raw["components"]:
            raise ValueError("no components")
        for comp, entry in raw["components"].items():
            if not isinstance(entry["fingerprint"], dict) or not isinstance(entry["buffers"], dict):
                raise ValueError(f"component {comp!r} needs a fingerprint object and a buffers object")
            fps[comp] = entry["fingerprint"]
            specs[comp], keys[comp], digests[comp] = {}, {}, {}
            for name, b in entry["buffers"].items():
                info = BufferInfo.from_json(b)
                if not isinstance(b["key"], str) or not isinstance(b["digest"], str):
                    raise ValueError(f"buffer {comp}.{name} needs a key and a digest")
                specs[comp][name], keys[comp][name], digests[comp][name] = info, b["key"], b["digest"]
        digest, nbytes = raw["digest"], raw["nbytes"]
        if not isinstance(digest, str) or not isinstance(nbytes, int):
            raise ValueError("digest must be a string and nbytes an integer")
        held = sum(i.nbytes for infos in specs.values() for i in infos.values())
        if nbytes != held:
            raise ValueError(f"nbytes {nbytes} is not the sum of the buffers' {held}")
        boundary = Boundary.from_json(raw["boundary"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
        raise _corrupt(path, f"{MANIFEST_FILE} is malformed ({detail}); write the capsule again") from err
    return Manifest(path, boundary, specs, fps, keys, digests, digest, nbytes, raw["format_version"], raw)


def _check_version_and_seal(path: Path, raw: Any) -> None:
    """Refuse another format, another version, or a manifest whose ``manifest_digest`` does not match."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise _corrupt(
            path, f"{MANIFEST_FILE} is malformed (format is {got!r}, expected {FORMAT!r}); write the capsule again"
        )
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < FORMAT_VERSION:
            why = f"format_version {version} was written before manifests were sealed ({_SEAL}); this rollcap reads version {FORMAT_VERSION}, take the capsule again"
        elif isinstance(version, int) and version > FORMAT_VERSION:
            why = f"format_version {version}; this rollcap reads version {FORMAT_VERSION} (upgrade rollcap for newer capsules)"
        else:
            why = f"format_version {version!r} is not a version; write the capsule again"
        raise _corrupt(path, why)
    try:
        sealed = raw.get(_SEAL) == _manifest_digest(raw)
    except (TypeError, ValueError):  # NaN or Infinity: never written by save()
        sealed = False
    if not sealed:
        raise _corrupt(path, f"{MANIFEST_FILE} does not match its {_SEAL} (edited or damaged); write the capsule again")


def open_disk(path: str | Path) -> Capsule:
    """A disk-tier handle to the capsule at ``path`` (manifest checked, bytes not read)."""
    m = read_manifest(path)
    return Capsule(m.boundary, m.specs, m.fingerprints, "disk", None, m.path, known_digest=m.digest)


def _read_tensors(path: Path, m: Manifest) -> dict[str, torch.Tensor]:
    """The manifest's tensors, each dtype and shape checked against the file's header before it is read."""
    tfile = path / TENSORS_FILE
    if not tfile.is_file():
        raise _corrupt(path, f"{TENSORS_FILE} is missing; the capsule is incomplete, write it again")
    want = {m.keys[c][n]: (c, n) for c in m.keys for n in m.keys[c]}
    try:
        with safetensors.safe_open(str(tfile), framework="pt") as f:
            meta = f.metadata() or {}
            have = set(f.keys())
            for key in sorted(set(want) - have):
                c, n = want[key]
                raise _corrupt(
                    path,
                    f"manifest lists buffer {c}.{n} (key {key!r}) but {TENSORS_FILE} lacks it; write the capsule again",
                )
            for key in sorted(have - set(want)):
                raise _corrupt(
                    path,
                    f"{TENSORS_FILE} holds {key!r}, which the manifest does not list (buffer missing from the manifest); write the capsule again",
                )
            for key, (c, n) in want.items():
                info, piece = m.specs[c][n], f.get_slice(key)
                dtype = DISK_DTYPES.get(piece.get_dtype(), piece.get_dtype())
                if (dtype, list(piece.get_shape())) != (info.dtype, _header_shape(info.dtype, info.shape)):
                    got = f"{dtype}{list(piece.get_shape())}" + (" (header shape)" if dtype in _PACKED else "")
                    raise _corrupt(
                        path,
                        f"{c}.{n}: manifest says {info.dtype}{list(info.shape)}, {TENSORS_FILE} holds {got}; write the capsule again",
                    )
            tensors = {k: f.get_tensor(k) for k in want}
    except safetensors.SafetensorError as err:
        raise _corrupt(path, f"{TENSORS_FILE} is damaged ({err}); write the capsule again") from err
    if meta.get(_META_DIGEST) != m.digest:
        raise _corrupt(
            path,
            f"{TENSORS_FILE} belongs to capsule {meta.get(_META_DIGEST)!r}, the manifest to {m.digest!r}; the two files were mixed up, write the capsule again",
        )
    return tensors


def load(path: str | Path, *, expect_digest: str | None = None, verify: bool = True) -> Capsule:
    """Read a disk capsule into the host tier, checking every buffer's spec and digest.

    Args:
        path: the capsule directory.
        expect_digest: refuse a capsule whose manifest digest differs (the
            directory was replaced since it was written).
        verify: recompute the byte digests (leave on except for trusted benchmarks).

    Raises:
        CorruptCapsule: a file is missing, the manifest is malformed, a buffer
            is missing or of another shape/dtype, or a digest differs.
    """
    path = Path(path)
    m = read_manifest(path)
    if expect_digest is not None and m.digest != expect_digest:
        raise _corrupt(
            path,
            f"manifest digest {m.digest} differs from the expected {expect_digest}; the directory was replaced since it was written",
        )
    tensors = _read_tensors(path, m)
    state: dict[str, dict[str, StateValue]] = {}
    pin = torch.cuda.is_available()
    for comp, infos in m.specs.items():
        state[comp] = {}
        for name, info in infos.items():
            t = tensors[m.keys[comp][name]]  # dtype and shape checked against the header by _read_tensors
            value: StateValue = t.numpy() if info.kind == "numpy" else t
            if info.kind == "torch" and pin and info.device.startswith("cuda"):
                value = value.pin_memory()
            if verify and buffer_digest(name, value) != m.digests[comp][name]:
                raise _corrupt(
                    path,
                    f"{comp}.{name}: bytes do not match their digest (flipped or truncated data); write the capsule again",
                )
            state[comp][name] = value
    if verify and combine_digests(m.digests) != m.digest:
        raise _corrupt(
            path,
            "the overall digest does not match the buffer digests (the manifest was edited); write the capsule again",
        )
    return Capsule(m.boundary, m.specs, m.fingerprints, "host", state, known_digest=m.digest if verify else None)


def verify(capsule: Capsule) -> None:
    """Recompute an in-memory capsule's digest and compare it with the recorded one, if any.

    Raises:
        CorruptCapsule: the bytes changed since the digest was recorded.
    """
    if capsule.tier == "disk":
        load(capsule.path, expect_digest=capsule.known_digest)
        return
    recorded = carried_digest(capsule)
    capsule._cache.pop("buffer_digests", None)
    capsule._cache.pop("digest", None)
    actual = combine_digests(capsule.buffer_digests())
    if recorded is not None and actual != recorded:
        raise CorruptCapsule(
            f"capsule {capsule.label!r}: bytes digest {actual} differs from the recorded {recorded}; take the capsule again"
        )
