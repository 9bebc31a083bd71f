"""The capture guard: each hazard planted in a small captured function is refused on CPU, naming op and line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.kernels import BufferSet, BufferSpec, CaptureHazard, CapturedGraph
from rollcap.kernels.guard import check_capturable

W = torch.nn.Linear(4, 4).eval()


def _graph(fn, backend="jit"):
    ins = BufferSet([BufferSpec("x", (1, 4), torch.float32)])
    outs = BufferSet([BufferSpec("y", (1, 4), torch.float32)])
    return CapturedGraph(lambda b: {"y": fn(b["x"])}, ins, outs, backend, [W], label="probe")


HAZARDS = {
    "torch.tensor": (lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]), "aten.lift_fresh"),
    "as_tensor": (lambda x: x * torch.as_tensor(np.ones(4, dtype=np.float32)), "aten.lift_fresh"),
    "from_numpy": (lambda x: x - torch.from_numpy(np.zeros(4, dtype=np.float32)), "aten.lift_fresh"),
    "item": (lambda x: x * x.sum().item(), r"\.item\(\)"),
    "python branch": (lambda x: x if x.sum() > 0 else -x, "bool"),
    "float()": (lambda x: x * float(x[0, 0]), "float"),
    "tolist": (lambda x: x + len(x.tolist()), r"\.tolist\(\)"),
    "numpy": (lambda x: x + float(x.numpy().sum()), r"\.numpy\(\)"),
    "cpu": (lambda x: x.cpu() * 2, r"\.cpu\(\)"),
    "nonzero": (lambda x: x + x.nonzero().sum(), "aten.nonzero"),
    "boolean mask": (lambda x: x + x[x > 0].sum(), "boolean mask"),
    "masked_select": (lambda x: x + torch.masked_select(x, x > 0).sum(), "aten.masked_select"),
    "global randn": (lambda x: x + torch.randn(1, 4), "aten.randn"),
    "rand_like": (lambda x: x + torch.rand_like(x), "aten.rand_like"),
    "normal_": (lambda x: torch.empty_like(x).normal_() + x, "aten.normal_"),
    "dropout (train)": (lambda x: torch.nn.functional.dropout(x, 0.5, training=True), "random draw"),
}


@pytest.mark.parametrize("backend", ["jit", "check_capturable"])
@pytest.mark.parametrize("name", sorted(HAZARDS))
def test_planted_hazard_is_refused_on_cpu(name, backend):
    """A hazard inside a captured function is one CaptureHazard naming the op and this file's line, before capture."""
    fn, op = HAZARDS[name]
    if backend == "jit":
        g = _graph(fn)
        with pytest.raises(CaptureHazard, match=op) as err:
            g.prepare()
        assert g.phase == "new"  # nothing captured
    else:  # the guard on its own, as the LeRobot path or a user's function would call it
        with pytest.raises(CaptureHazard, match=op) as err:
            check_capturable(fn, torch.ones(1, 4), label="probe")
    msg = str(err.value)
    assert msg.startswith("probe: cannot capture: ") and "test_guard.py:" in msg and "\n" not in msg


def test_capturable_forms_pass():
    """Device factories, scalars, integer indexing, SDPA with a mask and dropout in eval pass the guard."""

    def fn(x):
        m = torch.ones(1, 4, dtype=torch.bool)
        q = x[:, None, None, :].expand(1, 1, 4, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m[:, None, None, :])
        y = torch.where(x > 0, x, 0.0) * 2.0 + torch.full_like(x, 0.5) + torch.arange(4) * 0.1
        y = y[:, torch.arange(4)] + a[:, 0, 0] + x.to(torch.float64).to(torch.float32)
        return torch.nn.functional.dropout(W(y), 0.5, training=False)

    g = _graph(fn).prepare()
    g.replay()
    assert g.phase == "captured"


def test_eager_backend_is_not_guarded():
    """The eager backend captures nothing, so a user's eager function may do what it likes."""
    g = _graph(lambda x: x + torch.tensor([1.0, 2.0, 3.0, 4.0]), backend="eager").prepare()
    g.replay()
    assert torch.equal(g.outputs["y"], torch.tensor([[1.0, 2.0, 3.0, 4.0]]))


def test_guard_changes_no_bits():
    """The guarded warm-up gives the same outputs as an unguarded call."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    ).eval()
    x = torch.randn(1, 4)
    with torch.no_grad():
        ref = net(x)
    assert torch.equal(check_capturable(net, x), ref)
