"""The op trace digests each op's inputs and outputs; the first op with equal inputs and other outputs is named."""

from __future__ import annotations

import torch

from rollcap.kernels.opdiff import first_difference, trace_ops


def test_trace_lists_every_op_in_order_with_digests():
    """A small forward's ops come back in call order, each with an input and an output digest."""
    lin = torch.nn.Linear(4, 3)
    ops = trace_ops(lambda x: torch.relu(lin(x)), torch.ones(2, 4))
    assert [o["op"] for o in ops][-2:] == ["addmm", "relu"]
    assert all(len(o["inputs"]) == 16 and len(o["outputs"]) == 16 for o in ops)
    again = trace_ops(lambda x: torch.relu(lin(x)), torch.ones(2, 4))
    assert first_difference(ops, again) is None


def test_first_difference_skips_ops_whose_inputs_already_differ():
    """Downstream ops fed different inputs are consequences; the cause is the op whose inputs were equal."""
    a = [{"op": "view", "inputs": "1", "outputs": "2"}, {"op": "addmm", "inputs": "2", "outputs": "3"}]
    b = [{"op": "view", "inputs": "1", "outputs": "2"}, {"op": "addmm", "inputs": "2", "outputs": "4"}]
    c = [{"op": "view", "inputs": "1", "outputs": "2"}, {"op": "addmm", "inputs": "9", "outputs": "4"}]
    assert first_difference(a, b) == {"index": 1, "op": "addmm", "ops": 2, "why": "equal inputs, other outputs"}
    assert first_difference(a, c)["why"].startswith("other inputs")
    assert first_difference(a, a[:1])["why"] == "2 ops vs 1"
