"""The rows the env workers and the GPU-owning process share: one shared-memory block, an array per name.

The parent creates the block from a :class:`Layout` (name -> shape, dtype; the
leading axis is the slot); a worker attaches it by name. Observations and noise
go in (``p.<input>`` for the policy's static inputs, ``c.<input>`` for the
critic's), chunks, values and the replays' latencies come out (``actions``,
``value``, ``latency``). Each slot's row is written by the one process that
owns it at that moment (its worker before the round's "launched", the parent
between "launched" and "go"), so nothing is locked. The bytes are copied as they
are: a row in shared memory is the row a batched runner's ``load_row`` would
have written.

Imports point downward: numpy and the standard library only.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np

_ALIGN = 64


class Layout:
    """Named arrays and their offsets in one block (JSON-able: :meth:`to_json` / :meth:`from_json`)."""

    def __init__(self, arrays: dict[str, tuple[tuple[int, ...], str]]):
        self.arrays = {k: (tuple(int(d) for d in shape), np.dtype(dtype).str) for k, (shape, dtype) in arrays.items()}
        self.offsets: dict[str, int] = {}
        pos = 0
        for name, (shape, dtype) in self.arrays.items():
            self.offsets[name] = pos
            size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            pos += -(-size // _ALIGN) * _ALIGN
        self.nbytes = max(pos, _ALIGN)

    def to_json(self) -> dict:
        return {k: [list(shape), dtype] for k, (shape, dtype) in self.arrays.items()}

    @classmethod
    def from_json(cls, d: dict) -> Layout:
        return cls({k: (tuple(shape), dtype) for k, (shape, dtype) in d.items()})


class SharedRows:
    """The block itself: :attr:`arrays` are numpy views of it (name -> array, slot first).

    Args:
        layout: what the block holds.
        name: attach the block of this name (a worker); None creates one (the parent, which unlinks it at :meth:`close`).
    """

    def __init__(self, layout: Layout, name: str | None = None):
        self.layout, self.owner = layout, name is None
        self.shm = shared_memory.SharedMemory(name=name, create=name is None, size=layout.nbytes if name is None else 0)
        self.name = self.shm.name
        self.arrays: dict[str, np.ndarray] = {
            k: np.ndarray(shape, np.dtype(dtype), buffer=self.shm.buf, offset=layout.offsets[k])
            for k, (shape, dtype) in layout.arrays.items()
        }

    def close(self) -> None:
        """Drop the views and the mapping; the parent also removes the block."""
        if self.shm is None:
            return
        self.arrays = {}
        shm, self.shm = self.shm, None
        shm.close()
        if self.owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


def numpy_dtype(torch_dtype) -> str:
    """A static buffer's dtype as numpy names it (uint8, float32, int64, ...)."""
    import torch

    return np.dtype(torch.empty((), dtype=torch_dtype).numpy().dtype).str


def layout_for(policy, critic, extra: dict | None = None) -> Layout:
    """The block of a run: every static input of the policy (``p.*``) and critic (``c.*``) runner at the run's batch
    (``policy`` / ``critic``: one runner each, or G of them, whose batches add up), the outputs, and ``extra``."""
    policies = policy if isinstance(policy, list) else [policy]
    critics = [] if critic is None else critic if isinstance(critic, list) else [critic]
    n = sum(r.batch for r in policies)
    arrays: dict[str, tuple[tuple[int, ...], str]] = {}
    for prefix, runner in (("p", policies[0]), ("c", critics[0] if critics else None)):
        if runner is None:
            continue
        for spec in runner.inputs.specs:
            arrays[f"{prefix}.{spec.name}"] = ((n, *spec.shape[1:]), numpy_dtype(spec.dtype))
    h, a = policies[0].chunk_shape
    arrays["actions"] = ((n, h, a), "<f4")
    arrays["value"] = ((n,), "<f4")
    arrays["latency"] = ((n, 2), "<f8")  # per slot: its graph's policy and critic replay seconds
    arrays.update(extra or {})
    return Layout(arrays)
