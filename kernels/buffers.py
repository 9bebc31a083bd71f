"""Named, preallocated static buffers.

A :class:`BufferSet` owns one contiguous tensor per name, of fixed shape and
dtype, on one device. Values are *copied in* (``write``), never rebound, so a
graph captured over the buffers' addresses stays valid for the buffers'
lifetime. Every write validates first and copies second: a rejected write
leaves every buffer as it was.

On a CPU device each buffer also has a numpy view of its memory
(:meth:`BufferSet.array`): a write of numpy arrays that already match their
buffers exactly is checked and copied through numpy, which costs a few
microseconds where torch's per-call dispatch costs tens at a chunk boundary.

On a CUDA device the buffers are views of one flat device block, and each has a
twin in one flat *pinned* host block (the staging area, with numpy views). A write
of exactly matching numpy arrays is copied into the staging views by numpy and
then to the device with one asynchronous copy on the caller's stream (all
buffers written: one copy of the whole block; some: one per buffer), so the host
neither blocks nor allocates. :meth:`BufferSet.fetch_async` copies the device
block back into the staging block (one asynchronous copy); after the stream has
passed it, :meth:`BufferSet.host` reads it. Nothing of this exists on a CPU device.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rollcap.kernels.errors import BadInput


STAGING_ALIGN = 256
"""Byte alignment of each buffer in a flat (staged) block: any dtype's view, and CUDA's own allocation alignment."""


@dataclass(frozen=True)
class BufferSpec:
    """Name, shape and dtype of one static buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch.")}


def _as_tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    return torch.as_tensor(value)


class BufferSet:
    """A fixed set of named static tensors on one device.

    Args:
        specs: the buffers to allocate (zero-filled).
        device: where they live.
        label: a short name used in error messages (e.g. ``"policy.in"``).

    Thread affinity: writes are not synchronised; the owner (a runner) writes
    only between replays, never while a lane is reading the buffers.
    """

    def __init__(
        self,
        specs: list[BufferSpec],
        device: torch.device | str = "cpu",
        label: str = "buffers",
        staging: bool | None = None,
    ):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"{label}: duplicate buffer names in {names}")
        self.label = label
        self.device = torch.device(device)
        self._specs: dict[str, BufferSpec] = {s.name: s for s in specs}
        self._staging: dict[str, torch.Tensor] = {}
        self._staging_arrays: dict[str, np.ndarray] = {}
        if staging if staging is not None else self.device.type == "cuda":
            self._tensors = self._flat_with_staging(specs)
        else:
            self._tensors = {s.name: torch.zeros(s.shape, dtype=s.dtype, device=self.device) for s in specs}
        self._arrays: dict[str, np.ndarray] = {}
        """CPU only: a numpy view of each buffer numpy can hold (not bfloat16); the same memory, never rebound."""
        if self.device.type == "cpu":
            for name, t in self._tensors.items():
                try:
                    self._arrays[name] = t.numpy()
                except TypeError:
                    pass

    def _flat_with_staging(self, specs: list[BufferSpec]) -> dict[str, torch.Tensor]:
        """The buffers as views of one flat device block, and their twins in one flat staging block (pinned on CUDA)."""
        offsets, total = [], 0
        for s in specs:
            total += -total % STAGING_ALIGN
            offsets.append(total)
            total += s.nbytes
        self._flat = torch.zeros(max(total, 1), dtype=torch.uint8, device=self.device)
        self._flat_host = torch.zeros(max(total, 1), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        tensors = {}
        for s, off in zip(specs, offsets):
            tensors[s.name] = self._flat[off : off + s.nbytes].view(s.dtype).view(s.shape)
            host = self._flat_host[off : off + s.nbytes].view(s.dtype).view(s.shape)
            self._staging[s.name] = host
            try:
                self._staging_arrays[s.name] = host.numpy()
            except TypeError:  # bfloat16: no numpy view; written through torch
                pass
        return tensors

    @property
    def staged(self) -> bool:
        """Whether the buffers have a host staging block (CUDA: pinned; see the module docstring)."""
        return bool(self._staging)

    def fetch_async(self) -> None:
        """Enqueue one copy of every buffer into its staging twin on the current stream (no host wait)."""
        self._flat_host.copy_(self._flat, non_blocking=True)

    def host(self, name: str) -> np.ndarray | None:
        """A numpy view of ``name``'s host memory: the buffer itself on CPU, its staging twin (as of the last
        :meth:`fetch_async` the stream has passed) on CUDA; None for a dtype numpy lacks."""
        return self._staging_arrays.get(name) if self._staging else self._arrays.get(name)

    # -- introspection -----------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._specs)

    @property
    def specs(self) -> list[BufferSpec]:
        return list(self._specs.values())

    def spec(self) -> list[dict]:
        """JSON-able description: names, shapes, dtypes."""
        return [s.to_json() for s in self._specs.values()]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._specs.values())

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"{self.label}: no buffer named {name!r}; have {self.names}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live tensors themselves (read them; write through :meth:`write`)."""
        return dict(self._tensors)

    def array(self, name: str) -> np.ndarray | None:
        """A numpy view of buffer ``name`` (its live memory: read it, copy what you keep); None off the CPU or for a dtype numpy lacks."""
        return self._arrays.get(name)

    def data_ptrs(self) -> dict[str, int]:
        return {k: t.data_ptr() for k, t in self._tensors.items()}

    # -- writes --------------------------------------------------------------
    def check(self, name: str, value, *, finite: bool = False) -> torch.Tensor:
        """Validate one value against its buffer and return it as a tensor (no copy made)."""
        if name not in self._specs:
            raise BadInput(f"{self.label}: unknown input {name!r}; expected one of {self.names}")
        spec = self._specs[name]
        t = _as_tensor(value)
        if tuple(t.shape) != spec.shape:
            raise BadInput(
                f"{self.label}.{name}: expected shape {tuple(spec.shape)}, got {tuple(t.shape)} "
                "(no broadcasting is done)"
            )
        if t.dtype != spec.dtype:
            raise BadInput(
                f"{self.label}.{name}: expected dtype {str(spec.dtype).removeprefix('torch.')}, "
                f"got {str(t.dtype).removeprefix('torch.')}"
            )
        if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise BadInput(f"{self.label}.{name}: contains NaN or Inf")
        return t

    def write(self, values: Mapping[str, object], *, finite: tuple[str, ...] | bool = ()) -> None:
        """Copy values into their buffers: validate all first, then copy all.

        Args:
            values: name -> array/tensor of exactly the buffer's shape and dtype.
            finite: names (or True for all) whose float values must be finite.
        """
        if not finite and self._write_arrays(values):
            return
        checked = []
        for name, value in values.items():
            must_be_finite = finite is True or (not isinstance(finite, bool) and name in finite)
            checked.append(
                (self._tensors[name] if name in self._tensors else None, self.check(name, value, finite=must_be_finite))
            )
        if not checked:
            return
        dst = [d for d, _ in checked]
        src = [s for _, s in checked]
        if any(s.device != self.device for s in src) or len(src) == 1:
            for d, s in zip(dst, src):
                d.copy_(s, non_blocking=False)
        else:
            torch._foreach_copy_(dst, src)

    def _write_staged(self, values: Mapping[str, object]) -> bool:
        """:meth:`_write_arrays` for staged buffers: numpy into the staging views, then asynchronous copies."""
        arrays = self._staging_arrays
        pairs = []
        for name, value in values.items():
            dst = arrays.get(name)
            if dst is None or type(value) is not np.ndarray or value.shape != dst.shape or value.dtype != dst.dtype:
                return False
            pairs.append((name, dst, value))
        for _, dst, value in pairs:
            np.copyto(dst, value)
        if len(pairs) == len(self._tensors):  # every buffer: one copy of the whole block
            self._flat.copy_(self._flat_host, non_blocking=True)
        else:
            for name, _, _ in pairs:
                self._tensors[name].copy_(self._staging[name], non_blocking=True)
        return True

    def write_row(self, name: str, row: int, value: np.ndarray) -> None:
        """Copy ``value`` (row ``row``'s data, already validated) into that row of buffer ``name``."""
        if name in self._staging_arrays:
            np.copyto(self._staging_arrays[name][row], value)
            self._tensors[name][row].copy_(self._staging[name][row], non_blocking=True)
        elif (
            name in self._arrays and value.dtype == self._arrays[name].dtype
        ):  # CPU: the numpy view, ~1 us (copy_: ~10)
            self._arrays[name][row] = value
        else:
            self._tensors[name][row].copy_(torch.from_numpy(np.ascontiguousarray(value)))

    def write_rows(self, rows: Sequence[Mapping[str, np.ndarray] | None]) -> None:
        """Rows' data at once, as :meth:`write_row` each: ``rows[i]`` is row ``i``'s (name -> a batch-1 array, already
        validated and of its buffer's dtype; every row names the same buffers), or None: row ``i`` is left as it is.

        When every row of a buffer is written, it is filled by one concatenation (on CUDA into its staging twin, then
        one asynchronous copy): a batched round's inputs cost a copy a buffer, not one a row.
        """
        written = [(i, r) for i, r in enumerate(rows) if r is not None]
        if not written:
            return
        whole = len(written) == len(rows)
        for name in written[0][1]:
            dst = self._staging_arrays.get(name) if self._staging else self._arrays.get(name)
            if whole and dst is not None and len(dst) == len(rows):
                np.concatenate([r[name] for r in rows], out=dst, casting="no")
                if self._staging:
                    self._tensors[name].copy_(self._staging[name], non_blocking=True)
            else:
                for i, r in written:
                    self.write_row(name, i, r[name][0])

    def _write_arrays(self, values: Mapping[str, object]) -> bool:
        """The common case on a CPU device: numpy arrays of exactly their buffers' shape and dtype, copied through numpy.

        Returns False (nothing written) when any value is not such an array: :meth:`write`'s torch path then
        checks everything and names what is wrong.
        """
        if self._staging:
            return self._write_staged(values)
        arrays = self._arrays
        if not arrays:
            return False
        pairs = []
        for name, value in values.items():
            dst = arrays.get(name)
            if dst is None or type(value) is not np.ndarray or value.shape != dst.shape or value.dtype != dst.dtype:
                return False
            pairs.append((dst, value))
        for dst, value in pairs:
            np.copyto(dst, value)
        return True

    def load(self, values: Mapping[str, torch.Tensor], copy: bool = True) -> None:
        """Copy a complete set of values back (every buffer named, nothing extra).

        Used by capsule restore; validates everything before the first copy.
        ``copy=False`` only validates.
        """
        missing = set(self._specs) - set(values)
        extra = set(values) - set(self._specs)
        if missing or extra:
            raise BadInput(
                f"{self.label}: load needs exactly {sorted(self._specs)}; missing {sorted(missing)}, extra {sorted(extra)}"
            )
        if copy:
            self.write(values)
        else:
            for name, value in values.items():
                self.check(name, value)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Independent copies of every buffer (same device)."""
        return {k: t.clone() for k, t in self._tensors.items()}

    def fill_(self, value: float = 0.0) -> None:
        for t in self._tensors.values():
            t.fill_(value)
