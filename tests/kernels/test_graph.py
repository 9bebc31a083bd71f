"""CapturedGraph phases, exactness against eager, and the capture counter."""

from __future__ import annotations

import warnings

import pytest
import torch

from rollcap.kernels import BufferSet, BufferSpec, CaptureError, CaptureHazard, CapturedGraph, capture_count


def _mlp_graph(backend: str) -> tuple[CapturedGraph, torch.nn.Module]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    ins = BufferSet([BufferSpec("x", (1, 8), torch.float32), BufferSpec("noise", (1, 4), torch.float32)])
    outs = BufferSet([BufferSpec("y", (1, 4), torch.float32)])

    def fn(b):
        return {"y": net(b["x"]) + b["noise"]}

    return CapturedGraph(fn, ins, outs, backend, [net], label="mlp"), net


@pytest.mark.parametrize("backend", ["eager", "jit"])
def test_replay_matches_eager_bytes(backend):
    """Replays equal the eager module bit-for-bit on changing inputs."""
    g, net = _mlp_graph(backend)
    g.prepare()
    for i in range(5):
        x, n = torch.randn(1, 8), torch.randn(1, 4)
        g.inputs.write({"x": x, "noise": n})
        g.replay()
        with torch.no_grad():
            assert torch.equal(g.outputs["y"], net(x) + n)


def test_phases_are_enforced():
    """replay before capture and capture before warmup raise CaptureError."""
    g, _ = _mlp_graph("jit")
    with pytest.raises(CaptureError, match="new"):
        g.replay()
    with pytest.raises(CaptureError):
        g.capture()
    g.warmup()
    g.capture()
    with pytest.raises(CaptureError, match="captured"):
        g.warmup()


def test_capture_counts_once_and_replays_never():
    """One capture adds one to the counter; 1,000 replays with new inputs add none."""
    g, _ = _mlp_graph("jit")
    before = capture_count()
    g.prepare()
    assert capture_count() == before + 1
    for i in range(1000):
        g.inputs.write({"x": torch.full((1, 8), float(i)), "noise": torch.zeros(1, 4)})
        g.replay()
    assert capture_count() == before + 1


def test_backend_device_mismatch_is_refused():
    """Unknown backends and cuda-on-cpu are clear errors."""
    ins = BufferSet([BufferSpec("x", (1,), torch.float32)])
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        CapturedGraph(lambda b: b, ins, ins, "tpu")
    with pytest.raises(ValueError, match="needs buffers on a CUDA device"):
        CapturedGraph(lambda b: b, ins, ins, "cuda")


def test_jit_capture_refuses_what_the_tracer_would_freeze():
    """A torch.tensor constant and a tensor read as a Python number are refused in warm-up, before the tracer sees them."""
    ins = BufferSet([BufferSpec("x", (1, 2), torch.float32)])
    outs = BufferSet([BufferSpec("y", (1, 2), torch.float32)])
    for fn, op in (
        (lambda b: {"y": b["x"] * torch.tensor([1.0, 2.0])}, "aten.lift_fresh"),
        (lambda b: {"y": b["x"] * float(b["x"].sum())}, "float"),
    ):
        g = CapturedGraph(fn, ins, outs, "jit", label="w")
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)  # nothing reaches the tracer
            with pytest.raises(CaptureHazard, match=op):
                g.warmup()


@pytest.mark.cuda
def test_cuda_graph_matches_eager_bytes():
    """A CUDA graph replay equals eager on the same device byte-for-byte."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).cuda().eval()
    ins = BufferSet([BufferSpec("x", (1, 8), torch.float32)], "cuda")
    outs = BufferSet([BufferSpec("y", (1, 4), torch.float32)], "cuda")
    g = CapturedGraph(lambda b: {"y": net(b["x"])}, ins, outs, "cuda", [net]).prepare()
    for _ in range(3):
        x = torch.randn(1, 8, device="cuda")
        ins.write({"x": x})
        g.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.equal(outs["y"], net(x))
