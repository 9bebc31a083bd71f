"""Every dtype torch and safetensors share goes through every tier bit-exactly; real env capsules through disk."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch

from rollcap.capsule import inspect_main, load, move, restore, save, snapshot

# Written out here (not taken from rollcap's table) so the test notices a dtype the table loses.
SHARED_TORCH = [
    name
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
]
"""torch dtypes that safetensors writes and reads (this torch's subset)."""

SHARED_NUMPY = [
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
]
"""numpy dtypes the disk tier stores (as the torch dtype of the same name)."""

TIERS = ("device", "host", "disk")


def _random_bits(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor whose bytes are random (NaN payloads included); bools are 0/1."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    n = int(np.prod(shape)) * dtype.itemsize
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def _raw(v) -> bytes:
    if isinstance(v, torch.Tensor):
        return v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(v).tobytes()


class Buffers:
    """A component whose state is a fixed dict of tensors and arrays, copied back in place."""

    def __init__(self, values: Mapping[str, torch.Tensor | np.ndarray]):
        self.values = dict(values)

    def live_state(self) -> dict:
        return self.values

    def load_live_state(self, state: Mapping) -> None:
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                self.values[k].copy_(v)
            else:
                np.copyto(self.values[k], v)

    def state_fingerprint(self) -> dict:
        return {"component": "buffers", "names": sorted(self.values)}


def _scramble(comp: Buffers) -> None:
    for k, v in comp.values.items():
        if isinstance(v, torch.Tensor):
            if v.dtype == torch.bool:
                v.logical_not_()
            else:
                v.reshape(-1).view(torch.uint8).bitwise_not_()
        elif v.dtype == np.bool_:
            np.logical_not(v, out=v)
        else:
            np.invert(v.reshape(-1).view(np.uint8), out=v.reshape(-1).view(np.uint8))


def _capsule_on(tier: str, comp: Buffers, tmp_path):
    cap = snapshot({"c": comp}, "dtypes", tier="host" if tier == "disk" else tier)
    return (save(cap, tmp_path / "cap") if tier == "disk" else cap), cap


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", SHARED_TORCH)
def test_torch_dtype_round_trip(dtype, tier, tmp_path):
    """A torch buffer of every shared dtype comes back with its dtype, shape and bytes, and restores them."""
    dt = getattr(torch, dtype)
    value = _random_bits(dt, (3, 5), seed=len(dtype))
    scalar = (1,) if dtype == "float4_e2m1fn_x2" else ()  # safetensors cannot hold a 0-d packed fp4
    comp = Buffers({"x": value.clone(), "scalar": _random_bits(dt, scalar, seed=1)})
    want = {k: _raw(v) for k, v in comp.values.items()}
    cap, mem = _capsule_on(tier, comp, tmp_path)
    back = load(cap.path) if tier == "disk" else move(cap, "host")
    assert back.digest == mem.digest
    for k in want:
        got = back.state["c"][k]
        assert isinstance(got, torch.Tensor) and got.dtype == dt and _raw(got) == want[k]
    _scramble(comp)
    assert _raw(comp.values["x"]) != want["x"]
    restore(cap, {"c": comp})
    assert {k: _raw(v) for k, v in comp.values.items()} == want


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", SHARED_NUMPY)
def test_numpy_dtype_round_trip(dtype, tier, tmp_path):
    """A numpy buffer of every storable dtype comes back as numpy with its dtype and bytes."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(len(dtype))
    if dt == np.bool_:
        value = rng.integers(0, 2, (4, 3)).astype(bool)
    else:
        value = rng.integers(0, 256, 12 * dt.itemsize, dtype=np.uint8).view(dt).reshape(4, 3)
    comp = Buffers({"x": value.copy()})
    want = _raw(value)
    cap, mem = _capsule_on(tier, comp, tmp_path)
    back = load(cap.path) if tier == "disk" else move(cap, "host")
    got = back.state["c"]["x"]
    assert isinstance(got, np.ndarray) and got.dtype == dt and _raw(got) == want and back.digest == mem.digest
    _scramble(comp)
    restore(cap, {"c": comp})
    assert _raw(comp.values["x"]) == want


def test_inspect_reads_every_shared_dtype(tmp_path, capsys):
    """`capsule inspect` on a capsule holding every shared dtype reports digest OK and exits 0."""
    values = {d: _random_bits(getattr(torch, d), (2,), seed=i) for i, d in enumerate(SHARED_TORCH)}
    values.update({f"np_{d}": np.zeros(3, dtype=d) for d in SHARED_NUMPY})
    save(snapshot({"c": Buffers(values)}, "all", tier="host"), tmp_path / "cap")
    assert inspect_main([str(tmp_path / "cap")]) == 0
    out = capsys.readouterr()
    assert "OK" in out.out and "FAILED" not in out.out + out.err


UNSTORABLE = [
    pytest.param(
        torch.zeros(2, dtype=torch.complex128),
        r"c\.z is complex128 \(torch\).*disk tier cannot store",
        id="torch-complex128",
    ),
    pytest.param(
        np.zeros(2, dtype=np.complex128), r"c\.z is complex128 \(numpy\).*disk tier cannot store", id="numpy-complex128"
    ),
]
if "float4_e2m1fn_x2" in SHARED_TORCH:
    UNSTORABLE.append(
        pytest.param(
            _random_bits(torch.float4_e2m1fn_x2, (), 0), r"c\.z is a 0-d float4_e2m1fn_x2.*shape \(1,\)", id="0d-float4"
        )
    )


@pytest.mark.parametrize(("value", "match"), UNSTORABLE)
def test_unstorable_dtype_refused_in_one_line(value, match, tmp_path):
    """A buffer safetensors cannot hold is refused before anything is written, naming the buffer and the way out."""
    cap = snapshot({"c": Buffers({"z": value})}, "bad", tier="host")
    with pytest.raises(TypeError, match=match + ".*host tier") as err:
        save(cap, tmp_path / "cap")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cap").exists() and list(tmp_path.iterdir()) == []
