"""The capsule: named buffers frozen at a boundary, with metadata, fingerprints and a digest.

A :class:`Capsule` is immutable by contract. Its tensors may be shared with
forks and with the capsule it was derived from (copy-on-write: restores only
read them), so nothing may write them in place; derive a changed capsule with
:meth:`Capsule.with_buffers`. Numpy arrays are made read-only, and an in-place
write to a torch tensor is caught at restore time through the tensor's
version counter. Importing it imports no torch: a capsule of numpy buffers
(an env's exact state, RNG state) never needs it.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from rollcap.capsule.errors import CapsuleMismatch, CorruptCapsule
from rollcap.capsule.protocol import StateValue
from rollcap.kernels.files import plain_json
from rollcap.kernels.fingerprint import is_tensor, tensor_digest

TIERS = ("device", "host", "disk")
"""Where a capsule lives, fastest first: beside the live buffers, CPU memory, a directory."""

KINDS = ("torch", "numpy")


def json_normalize(value: Any, what: str) -> Any:
    """``value`` as JSON would return it (tuples become lists, numpy values plain Python); raises if it is not JSON-able."""
    try:
        return plain_json(value, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{what} must be JSON-able (str, int, float, bool, None, lists, dicts), got {value!r}: {err}"
        ) from err


_FROZEN: dict[int, MappingProxyType] = {}
"""id -> a fingerprint mapping :func:`frozen_json` returned (held, so the id stays its own)."""


def frozen_json(value: Mapping[str, Any], what: str) -> MappingProxyType:
    """``value`` normalised (:func:`json_normalize`) and read-only; a mapping this returned comes back as is.

    Snapshots of the same components share one frozen fingerprint each, so a
    snapshot does not round-trip the fingerprints through JSON every time.
    """
    if _FROZEN.get(id(value)) is value:
        return value  # type: ignore[return-value]
    frozen = MappingProxyType(json_normalize(dict(value), what))
    if len(_FROZEN) >= 4096:
        _FROZEN.clear()
    _FROZEN[id(frozen)] = frozen
    return frozen


# -- digests ---------------------------------------------------------------------
def buffer_digest(name: str, value: StateValue) -> str:
    """``tensor_digest({name: value})``, extended to 0-d torch tensors (same byte format)."""
    if is_tensor(value) and value.dim() == 0:
        import torch

        arr = value.detach().to("cpu").reshape(1)
        h = hashlib.sha256()
        h.update(f"{name}|{arr.dtype}|{()}|".encode())
        h.update(arr.view(torch.uint8).numpy().tobytes())
        return "sha256:" + h.hexdigest()
    return tensor_digest({name: value})


def carried_digest(capsule: Capsule) -> str | None:
    """The digest a capsule derived from ``capsule`` (moved, forked) carries over: known or already computed, else None."""
    return capsule.known_digest or capsule._cache.get("digest")


def combine_digests(per_buffer: Mapping[str, Mapping[str, str]]) -> str:
    """The capsule digest: sha256 over every buffer digest, in sorted component/buffer order."""
    h = hashlib.sha256()
    for comp in sorted(per_buffer):
        for name in sorted(per_buffer[comp]):
            h.update(f"{comp}\x00{name}\x00{per_buffer[comp][name]}\n".encode())
    return "sha256:" + h.hexdigest()


# -- metadata ----------------------------------------------------------------------
@dataclass(frozen=True)
class Boundary:
    """Where in a run a capsule was taken. Every field is JSON-able."""

    label: str = ""
    """A short name (``"episode-start"``, ``"chunk"``)."""
    episode: int | None = None
    """Episode index, if the caller has one."""
    chunk: int | None = None
    """Action-chunk index within the episode."""
    step: int | None = None
    """Env step within the episode."""
    wall_time: float = 0.0
    """``time.time()`` at snapshot (finite, >= 0)."""
    branch: int | None = None
    """Index among the siblings made by :func:`fork` (``None`` if not a fork)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Any further JSON-able facts the caller wants kept with the capsule."""

    def __post_init__(self) -> None:
        if not isinstance(self.label, str):
            raise TypeError(f"boundary label must be a str, got {type(self.label).__name__}")
        for name in ("episode", "chunk", "step", "branch"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise TypeError(f"boundary {name} must be an int or None, got {v!r}")
            if v is not None:
                object.__setattr__(self, name, int(v))
        if isinstance(self.wall_time, bool) or not isinstance(self.wall_time, (int, float, np.integer, np.floating)):
            raise TypeError(f"boundary wall_time must be a number, got {self.wall_time!r}")
        if not (math.isfinite(self.wall_time) and self.wall_time >= 0):
            raise ValueError(
                f"boundary wall_time must be finite and >= 0 (seconds since the epoch), got {self.wall_time!r}"
            )
        object.__setattr__(self, "wall_time", float(self.wall_time))
        object.__setattr__(
            self, "extra", MappingProxyType(json_normalize(dict(self.extra), "boundary extra") if self.extra else {})
        )

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "episode": self.episode,
            "chunk": self.chunk,
            "step": self.step,
            "wall_time": self.wall_time,
            "branch": self.branch,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Boundary:
        if not isinstance(d, Mapping):
            raise ValueError(f"boundary must be an object, got {type(d).__name__}")
        known = {k: d[k] for k in ("label", "episode", "chunk", "step", "wall_time", "branch", "extra") if k in d}
        return cls(**known)


def _itemsize(kind: str, dtype: str) -> int:
    """Bytes per element of a buffer dtype named as :class:`BufferInfo` names it; ``ValueError`` for another name."""
    if kind == "torch":
        import torch

        t = getattr(torch, dtype, None) if dtype.isidentifier() else None
        if not isinstance(t, torch.dtype):
            raise ValueError(f"unknown torch dtype {dtype!r}")
        return t.itemsize
    try:
        d = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"unknown numpy dtype {dtype!r}") from err
    if d.name != dtype or d.kind not in "biufc":
        raise ValueError(f"numpy dtype {dtype!r} cannot be in a capsule")
    return d.itemsize


@functools.lru_cache(maxsize=4096)
def _native_layout(info: BufferInfo) -> tuple:
    """``(type, dtype, shape)`` of a live value that :meth:`BufferInfo.same_layout` would accept."""
    if info.kind == "torch":
        import torch

        return torch.Tensor, getattr(torch, info.dtype), torch.Size(info.shape)
    return np.ndarray, np.dtype(info.dtype), info.shape


def _dtype_name(value: StateValue) -> str:
    if is_tensor(value):
        return str(value.dtype).removeprefix("torch.")
    return value.dtype.name


@dataclass(frozen=True)
class BufferInfo:
    """Kind, dtype, shape and home device of one captured buffer."""

    kind: str
    """``"torch"`` or ``"numpy"`` (numpy arrays come back as numpy)."""
    dtype: str
    """Dtype name without prefix: ``float32``, ``int64``, ``bool`` ..."""
    shape: tuple[int, ...]
    """Exact shape; restore never broadcasts."""
    device: str
    """Device of the live buffer it was taken from (``cpu`` for numpy)."""
    nbytes: int
    """Bytes of the values."""

    @classmethod
    def of(cls, value: StateValue) -> BufferInfo:
        """Describe a live value (raises ``TypeError`` for what a capsule cannot hold)."""
        if is_tensor(value):
            return cls(
                "torch", _dtype_name(value), tuple(value.shape), str(value.device), value.numel() * value.element_size()
            )
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufc" or value.dtype.hasobject:
                raise TypeError(
                    f"numpy dtype {value.dtype} cannot go into a capsule (numbers and bool only; no pickling)"
                )
            if not value.dtype.isnative:
                raise TypeError(
                    f"numpy dtype {value.dtype.str} is not native byte order; convert with .astype(dtype.newbyteorder('='))"
                )
            return cls("numpy", value.dtype.name, tuple(value.shape), "cpu", int(value.nbytes))
        raise TypeError(f"live state values must be torch.Tensor or numpy.ndarray, got {type(value).__name__}")

    def describe(self) -> str:
        """``float32[4, 8] (torch, cpu)``."""
        return f"{self.dtype}[{', '.join(map(str, self.shape))}] ({self.kind}, {self.device})"

    def same_layout(self, other: BufferInfo) -> bool:
        """Kind, dtype and shape equal (the device may differ)."""
        return (self.kind, self.dtype, self.shape) == (other.kind, other.dtype, other.shape)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "device": self.device,
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BufferInfo:
        if not isinstance(d, Mapping):
            raise ValueError(f"buffer entry must be an object, got {type(d).__name__}")
        kind, dtype, shape, device, nbytes = d["kind"], d["dtype"], d["shape"], d["device"], d["nbytes"]
        if kind not in KINDS or not isinstance(dtype, str) or not isinstance(device, str):
            raise ValueError(f"bad buffer entry {dict(d)!r}")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise ValueError(f"bad shape {shape!r}")
        itemsize = _itemsize(kind, dtype)
        if not isinstance(nbytes, int) or nbytes != math.prod(shape) * itemsize:
            raise ValueError(f"nbytes {nbytes!r} is not what {dtype}{shape} holds ({math.prod(shape) * itemsize})")
        if kind == "numpy" and device != "cpu":
            raise ValueError(f"a numpy buffer lives on cpu, not {device!r}")
        if kind == "torch":  # (a numpy buffer's is cpu, checked above)
            import torch

            try:
                torch.device(device)
            except (RuntimeError, ValueError) as err:
                raise ValueError(f"bad device {device!r}") from err
        return cls(kind, dtype, tuple(shape), device, nbytes)


# -- the capsule -------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Capsule:
    """Named buffers of several components frozen at one boundary.

    Build capsules with :func:`rollcap.capsule.snapshot` (or load them); the
    constructor checks that ``state`` agrees with ``specs`` and freezes both.

    Args:
        boundary: where in the run it was taken.
        specs: component -> buffer -> :class:`BufferInfo`.
        fingerprints: component -> what its ``state_fingerprint()`` returned.
        tier: ``"device"``, ``"host"`` or ``"disk"``.
        state: component -> buffer -> value (``None`` on the disk tier).
        path: the capsule's directory (disk tier only).
        known_digest: a digest just verified or read from a manifest; leave
            ``None`` to have it computed from the bytes on first use.
    """

    boundary: Boundary
    specs: Mapping[str, Mapping[str, BufferInfo]]
    fingerprints: Mapping[str, Mapping[str, Any]]
    tier: str
    state: Mapping[str, Mapping[str, StateValue]] | None = None
    path: Path | None = None
    known_digest: str | None = field(default=None, repr=False)
    _versions: Mapping[tuple[str, str], int] = field(init=False, repr=False, default_factory=dict)
    _cache: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"capsule tier must be one of {', '.join(TIERS)}, got {self.tier!r}")
        if (self.state is None) != (self.tier == "disk"):
            raise ValueError(
                f"a {self.tier}-tier capsule {'needs' if self.tier != 'disk' else 'holds no'} in-memory state"
            )
        if self.tier == "disk" and self.path is None:
            raise ValueError("a disk-tier capsule needs its directory path")
        specs = {c: MappingProxyType(dict(b)) for c, b in self.specs.items()}
        fps = {c: frozen_json(fp, f"fingerprint of component {c!r}") for c, fp in self.fingerprints.items()}
        if set(specs) != set(fps):
            raise CorruptCapsule(
                f"capsule {self.boundary.label!r}: components with buffers {sorted(specs)} differ from components with fingerprints {sorted(fps)}; rebuild it with snapshot()"
            )
        object.__setattr__(self, "specs", MappingProxyType(specs))
        object.__setattr__(self, "fingerprints", MappingProxyType(fps))
        if self.path is not None:
            object.__setattr__(self, "path", Path(self.path))
        if self.state is None:
            return
        state, versions = {}, {}
        for comp, bufs in self.state.items():
            if comp not in specs:
                raise CorruptCapsule(
                    f"capsule {self.boundary.label!r}: state holds component {comp!r} that its specs do not list; rebuild it with snapshot()"
                )
            if set(bufs) != set(specs[comp]):
                missing, extra = sorted(set(specs[comp]) - set(bufs)), sorted(set(bufs) - set(specs[comp]))
                raise CorruptCapsule(
                    f"capsule {self.boundary.label!r}: component {comp!r} state lacks {missing} / has unlisted {extra} against its specs; rebuild it with snapshot()"
                )
            for name, value in bufs.items():
                typ, dtype, shape = _native_layout(specs[comp][name])
                if not (
                    isinstance(value, typ) and value.dtype == dtype and value.shape == shape
                ):  # one pass; BufferInfo explains
                    info = BufferInfo.of(value)
                    raise CorruptCapsule(
                        f"capsule {self.boundary.label!r}: {comp}.{name} holds {info.describe()} but its spec says {specs[comp][name].describe()}; rebuild it with snapshot()"
                    )
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False
                else:
                    versions[(comp, name)] = value._version
            state[comp] = MappingProxyType(dict(bufs))
        if set(state) != set(specs):
            raise CorruptCapsule(
                f"capsule {self.boundary.label!r}: state lacks components {sorted(set(specs) - set(state))}; rebuild it with snapshot()"
            )
        object.__setattr__(self, "state", MappingProxyType(state))
        object.__setattr__(self, "_versions", MappingProxyType(versions))

    # -- introspection -------------------------------------------------------------
    @property
    def components(self) -> list[str]:
        return list(self.specs)

    @property
    def label(self) -> str:
        return self.boundary.label

    @property
    def nbytes(self) -> int:
        """Bytes of all buffer values (the same on every tier)."""
        return sum(i.nbytes for bufs in self.specs.values() for i in bufs.values())

    def buffers(self, component: str) -> Mapping[str, StateValue]:
        """The frozen values of one component (read them; never write them)."""
        if self.state is None:
            raise ValueError(
                f"capsule {self.label!r} is on the disk tier at {self.path}; load it (rollcap.capsule.load) before reading buffers"
            )
        if component not in self.state:
            raise KeyError(f"capsule {self.label!r} has no component {component!r}; it holds {self.components}")
        return self.state[component]

    def buffer_digests(self) -> dict[str, dict[str, str]]:
        """component -> buffer -> digest of its bytes (computed once, then cached)."""
        if "buffer_digests" not in self._cache:
            if self.state is None:
                raise ValueError(
                    f"capsule {self.label!r} is on the disk tier; its buffer digests are in {self.path}/manifest.json"
                )
            self.check_untouched()
            self._cache["buffer_digests"] = {
                c: {n: buffer_digest(n, v) for n, v in bufs.items()} for c, bufs in self.state.items()
            }
        return self._cache["buffer_digests"]

    @property
    def digest(self) -> str:
        """sha256 over every buffer's name, dtype, shape and bytes (lazy: computed on first use)."""
        if self.known_digest is not None:
            return self.known_digest
        if "digest" not in self._cache:
            self._cache["digest"] = combine_digests(self.buffer_digests())
        return self._cache["digest"]

    def layouts(self) -> dict[str, dict[str, tuple]]:
        """component -> buffer -> ``(type, dtype, shape)`` as live values carry them (computed once).

        Restore checks live buffers against these with one ``isinstance`` and
        two compares each; :class:`BufferInfo` explains a mismatch.
        """
        if "layouts" not in self._cache:
            self._cache["layouts"] = {
                c: {n: _native_layout(i) for n, i in bufs.items()} for c, bufs in self.specs.items()
            }
        return self._cache["layouts"]

    def all_tensors(self, component: str) -> bool:
        """Whether every buffer of ``component`` is a torch tensor (computed once)."""
        key = ("all_tensors", component)
        if key not in self._cache:
            self._cache[key] = all(i.kind != "numpy" for i in self.specs[component].values())
        return self._cache[key]

    def ordered_values(self, component: str) -> list[StateValue]:
        """The frozen values of ``component`` in its specs' order (the order restore's targets come in); computed once."""
        key = ("ordered", component)
        if key not in self._cache:
            state = self.buffers(component)
            self._cache[key] = [state[n] for n in self.specs[component]]
        return self._cache[key]

    def check_untouched(self) -> None:
        """Raise :class:`CorruptCapsule` if a tensor of this capsule was written in place."""
        if self.state is None:
            return
        pairs = self._cache.get("versions")
        if pairs is None:
            pairs = self._cache["versions"] = [(self.state[c][n], v, c, n) for (c, n), v in self._versions.items()]
        for t, version, comp, name in pairs:
            if t._version != version:
                raise CorruptCapsule(
                    f"capsule {self.label!r}: {comp}.{name} was written in place after the snapshot "
                    "(capsule tensors are shared with forks); derive changed capsules with Capsule.with_buffers()"
                )

    # -- copy-on-write -----------------------------------------------------------
    def with_buffers(self, component: str, values: Mapping[str, StateValue]) -> Capsule:
        """A new capsule with some buffers of one component replaced by copies of ``values``.

        Every other buffer is shared with this capsule (copy-on-write). Each
        value must match the buffer's kind, dtype and shape.
        """
        current = self.buffers(component)
        new = dict(current)
        for name, value in values.items():
            if name not in current:
                raise CapsuleMismatch(
                    f"capsule {self.label!r}: component {component!r} has no buffer {name!r}; it has {sorted(current)}",
                    component=component,
                    field=name,
                )
            want, got = self.specs[component][name], BufferInfo.of(value)
            if not want.same_layout(got):
                raise CapsuleMismatch(
                    f"{component}.{name}: capsule holds {want.describe()}, new value is {got.describe()}; pass a value of the same kind, dtype and shape",
                    component=component,
                    field=name,
                    expected=want.describe(),
                    got=got.describe(),
                )
            old = current[name]
            if is_tensor(old):  # same_layout: value is a tensor too
                import torch

                pinned = old.device.type == "cpu" and old.is_pinned()
                new[name] = torch.empty(old.shape, dtype=old.dtype, device=old.device, pin_memory=pinned).copy_(
                    value.detach()
                )
            else:
                new[name] = np.array(value, copy=True)
        state = dict(self.state)
        state[component] = new
        return Capsule(self.boundary, self.specs, self.fingerprints, self.tier, state)

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return f"Capsule(label={self.label!r}, tier={self.tier!r}, components={self.components}, nbytes={self.nbytes}{where})"
