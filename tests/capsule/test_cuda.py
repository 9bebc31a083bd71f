"""Capsules of CUDA buffers: device tier on the GPU, pinned host tier, disk back to the GPU."""

from __future__ import annotations

import pytest
import torch

from rollcap.capsule import load, restore, save, snapshot, to_device, to_host
from rollcap.kernels import BufferSet, BufferSpec, CapturedGraph, capture_count

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class CudaPolicy:
    """``y = tanh(x @ w) + noise`` captured as a CUDA graph over static buffers."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(16, 16, generator=gen).cuda()
        self.inp = BufferSet(
            [BufferSpec("x", (4, 16), torch.float32), BufferSpec("noise", (4, 16), torch.float32)], "cuda", "p.in"
        )
        self.out = BufferSet([BufferSpec("y", (4, 16), torch.float32)], "cuda", "p.out")
        self.graph = CapturedGraph(
            lambda i: {"y": torch.tanh(i["x"] @ self.w) + i["noise"]}, self.inp, self.out, "cuda"
        ).prepare()

    def step(self, k: int) -> bytes:
        gen = torch.Generator().manual_seed(k)
        self.inp.write(
            {"x": torch.randn(4, 16, generator=gen).cuda(), "noise": torch.randn(4, 16, generator=gen).cuda()}
        )
        self.graph.replay()
        self.inp.write({"x": self.out["y"]})
        torch.cuda.synchronize()
        return self.out["y"].cpu().numpy().tobytes()

    def live_state(self):
        return {**{f"in.{k}": v for k, v in self.inp.tensors().items()}, "out.y": self.out["y"]}

    def load_live_state(self, state):
        self.inp.load({k[3:]: v for k, v in state.items() if k.startswith("in.")})
        self.out.load({"y": state["out.y"]})

    def state_fingerprint(self):
        return {"device": torch.cuda.get_device_name()}


def test_cuda_tiers_round_trip(tmp_path):
    """Device capsule stays on the GPU, host capsule is pinned, disk comes back to the GPU; replays match."""
    p = CudaPolicy()
    p.step(0)
    comps = {"p": p}
    cap = snapshot(comps, "gpu")
    assert all(v.is_cuda for v in cap.state["p"].values())
    host = to_host(cap)
    assert all(v.device.type == "cpu" and v.is_pinned() for v in host.state["p"].values())
    save(host, tmp_path / "cap")
    expected = [p.step(k) for k in (1, 2)]
    n = capture_count()
    for c in (cap, host, to_device(host), load(tmp_path / "cap")):
        p.step(99)
        restore(c, comps)
        assert [p.step(k) for k in (1, 2)] == expected
    assert capture_count() == n
    assert all(v.is_cuda for v in to_device(load(tmp_path / "cap")).state["p"].values())
