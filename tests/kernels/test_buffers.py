"""BufferSet: fixed names/shapes/dtypes, copy-in, validation before any copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.kernels import BadInput, BufferSet, BufferSpec


def _bs() -> BufferSet:
    return BufferSet([BufferSpec("a", (2, 3), torch.float32), BufferSpec("b", (4,), torch.int64)], label="t")


def test_write_copies_into_same_storage():
    """Writes copy values in; the tensors' addresses never change."""
    bs = _bs()
    ptrs = bs.data_ptrs()
    bs.write({"a": np.ones((2, 3), np.float32), "b": torch.arange(4)})
    assert bs.data_ptrs() == ptrs
    assert torch.equal(bs["b"], torch.arange(4))
    assert bs.nbytes == 2 * 3 * 4 + 4 * 8


@pytest.mark.parametrize(
    "values, match",
    [
        ({"a": np.ones((3, 2), np.float32)}, "expected shape"),
        ({"a": np.ones((1, 3), np.float32)}, "no broadcasting"),
        ({"a": np.ones((2, 3), np.float64)}, "expected dtype float32"),
        ({"c": np.ones(1)}, "unknown input 'c'"),
    ],
)
def test_bad_writes_are_refused(values, match):
    """Wrong shape, dtype or name raises BadInput naming the buffer."""
    with pytest.raises(BadInput, match=match):
        _bs().write(values)


def test_refused_write_leaves_every_buffer_untouched():
    """A write with one bad value copies nothing, not even the good values."""
    bs = _bs()
    before = bs.snapshot()
    with pytest.raises(BadInput, match="NaN"):
        bs.write({"b": torch.arange(4) + 7, "a": np.full((2, 3), np.nan, np.float32)}, finite=True)
    for k, v in before.items():
        assert torch.equal(bs[k], v)


def test_load_requires_every_buffer():
    """load() (capsule restore) must name exactly the set's buffers."""
    bs = _bs()
    with pytest.raises(BadInput, match="missing \\['b'\\]"):
        bs.load({"a": torch.zeros(2, 3)})


def test_spec_lists_names_shapes_dtypes():
    """spec() is a JSON-able description."""
    assert _bs().spec() == [
        {"name": "a", "shape": [2, 3], "dtype": "float32"},
        {"name": "b", "shape": [4], "dtype": "int64"},
    ]


def test_numpy_writes_match_torch_writes_and_refuse_alike():
    """On CPU, exact numpy arrays are copied through the buffers' numpy views: the same bytes as the torch path
    (strided and read-only arrays too); one mismatched value sends the whole write to the checked path, which
    names it and copies nothing."""
    bs, ref = _bs(), _bs()
    a = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2]  # non-contiguous (2, 3)
    assert not a.flags.c_contiguous
    b = np.arange(4, dtype=np.int64)
    b.flags.writeable = False
    bs.write({"a": a, "b": b})
    ref.write({"a": torch.from_numpy(np.ascontiguousarray(a)), "b": torch.arange(4)})
    for k in ("a", "b"):
        assert torch.equal(bs[k], ref[k])
        assert bs.array(k).ctypes.data == bs[k].data_ptr()  # the view is the buffer's memory
    before = bs.snapshot()
    with pytest.raises(BadInput, match="t.a: expected dtype float32, got float64"):
        bs.write({"b": b + 1, "a": np.ones((2, 3), np.float64)})
    for k, v in before.items():
        assert torch.equal(bs[k], v)
    assert BufferSet([BufferSpec("h", (2,), torch.bfloat16)]).array("h") is None  # numpy has no bfloat16: torch path
