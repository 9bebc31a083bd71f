"""The CUDA runners' host path: pinned staging blocks, asynchronous copies, nothing allocated per call.

The staging logic is the same on any device (``BufferSet(..., staging=True)`` on CPU, unpinned): tested here on
CPU; a CPU runner keeps its plain buffers (no staging, the same bits as before). The cuda-marked test counts the
device and pinned-host allocations of whole calls.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rollcap.kernels.buffers import STAGING_ALIGN, BufferSet, BufferSpec

SPECS = [
    BufferSpec("image", (1, 5, 5, 3), torch.uint8),
    BufferSpec("state", (1, 7), torch.float32),
    BufferSpec("tokens", (1, 9), torch.int64),
]


class CountOps(TorchDispatchMode):
    """Every ATen op dispatched inside the block (a factory, a copy, a view: all of them)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (1, 5, 5, 3), dtype=np.uint8),
        "state": rng.standard_normal((1, 7)).astype(np.float32),
        "tokens": rng.integers(0, 259, (1, 9), dtype=np.int64),
    }


def test_cpu_buffers_have_no_staging_by_default():
    b = BufferSet(SPECS, "cpu")
    assert not b.staged and b.host("state") is b.array("state")


def test_staged_buffers_are_aligned_views_of_one_block_and_one_copy_writes_them_all():
    b = BufferSet(SPECS, "cpu", staging=True)
    assert b.staged
    base = b._flat.data_ptr()
    assert all((t.data_ptr() - base) % STAGING_ALIGN == 0 and t.is_contiguous() for t in b.tensors().values())
    v = _values(0)
    with CountOps() as count:
        b.write(v)
    assert count.ops == [
        "aten.copy_.default"
    ]  # numpy into the staging views, then the whole block: one copy, no allocation
    for k, x in v.items():
        assert np.array_equal(b[k].numpy(), x)


def test_a_partial_write_copies_only_its_buffers():
    """A buffer changed by another path (a capsule restore) is not clobbered by a write that does not name it."""
    b = BufferSet(SPECS, "cpu", staging=True)
    b.write(_values(0))
    b.load({k: torch.from_numpy(x) for k, x in _values(1).items()})  # the torch path: device buffers only
    b.write({"state": _values(2)["state"]})
    assert np.array_equal(b["state"].numpy(), _values(2)["state"])
    assert np.array_equal(b["tokens"].numpy(), _values(1)["tokens"])  # not the stale staging copy of _values(0)


def test_rows_and_fetch_through_the_staging_block():
    specs = [BufferSpec("x", (3, 4), torch.float32), BufferSpec("y", (3,), torch.float32)]
    b = BufferSet(specs, "cpu", staging=True)
    b.write_row("x", 1, np.arange(4, dtype=np.float32))
    assert b["x"][1].tolist() == [0.0, 1.0, 2.0, 3.0] and b["x"][0].abs().sum() == 0
    b["y"].copy_(torch.tensor([1.0, 2.0, 3.0]))  # as a replay writes the outputs
    b.fetch_async()
    assert b.host("y").tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("staging", [False, True], ids=["cpu", "staged"])
def test_write_rows_writes_what_write_row_writes_and_leaves_rows_not_named(staging):
    """Every row named: one concatenation a buffer (through the staging block when there is one); some rows: those
    rows, the others left as they were."""
    specs = [BufferSpec("x", (3, 4), torch.float32), BufferSpec("t", (3, 2), torch.int64)]
    rows = [{"x": np.full((1, 4), i, np.float32), "t": np.full((1, 2), 10 + i, np.int64)} for i in range(3)]
    b = BufferSet(specs, "cpu", staging=staging)
    b.write_rows(rows)
    assert b["x"][:, 0].tolist() == [0.0, 1.0, 2.0] and b["t"][:, 1].tolist() == [10, 11, 12]
    b.write_rows([None, {"x": np.full((1, 4), 7, np.float32), "t": np.full((1, 2), 17, np.int64)}, None])
    assert b["x"][:, 0].tolist() == [0.0, 7.0, 2.0] and b["t"][:, 1].tolist() == [10, 17, 12]
    b.write_rows([None, None, None])
    assert b["x"][:, 0].tolist() == [0.0, 7.0, 2.0]


def test_the_runner_host_path_dispatches_nothing_on_cpu():
    """A CPU policy runner's own path per call (validate and write the inputs, read the chunk back) runs no torch
    op at all: numpy into the buffers' memory, numpy out (the replay between is the model's)."""
    from rollcap.policies import PolicyRunner
    from rollcap.policies.shipped import DEFAULT_CHECKPOINT
    from rollcap.policies.runner import load_policy
    from tests.helpers import make_noise, make_obs

    runner = PolicyRunner(load_policy(DEFAULT_CHECKPOINT), backend="jit")
    try:
        obs, noise = make_obs(0, image_size=64, state_dim=28), make_noise(0, horizon=8)
        runner.act(obs, noise)
        with CountOps() as count:
            runner.load(obs, noise)
            runner.row_result(0)
        assert count.ops == []
        assert not runner.inputs.staged and not runner.outputs.staged  # CPU: the buffers (and bits) as before
    finally:
        runner.close()


@pytest.mark.cuda
def test_cuda_runner_allocates_nothing_per_call_and_stages_in_pinned_memory():
    from rollcap.policies import PolicyRunner
    from rollcap.policies.shipped import DEFAULT_CHECKPOINT
    from rollcap.policies.runner import load_policy
    from tests.helpers import make_noise, make_obs

    runner = PolicyRunner(load_policy(DEFAULT_CHECKPOINT), device="cuda")
    try:
        assert runner.inputs._flat_host.is_pinned() and runner.outputs._flat_host.is_pinned()
        obs, noise = make_obs(0, image_size=64, state_dim=28), make_noise(0, horizon=8)
        first = runner.act(obs, noise)
        assert first.tobytes() == runner.act_eager(obs, noise).tobytes()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        for i in range(10):
            assert runner.act(obs, noise).tobytes() == first.tobytes()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    finally:
        runner.close()
