"""Every shipped captured function passes the capture guard on CPU; the sampler that broke CUDA capture does not."""

from __future__ import annotations

import pytest
import torch

from rollcap.critics.runner import CriticRunner, load_critic
from rollcap.kernels import CaptureHazard
from rollcap.policies import FlowVLA, PolicyRunner
from rollcap.policies.flow_vla import ADV_DROPPED, ADV_POSITIVE
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.runner import load_policy

WEIGHTS = DEFAULT_CHECKPOINT.parent
CRITICS = WEIGHTS.parent.parent / "critics" / "weights"
POLICIES = ["pushblock_policy", "pushblock_policy_prefix", "mt10_policy", "mt10_policy_prefix"]


@pytest.mark.parametrize("name", POLICIES)
def test_shipped_policies_pass_the_guard(name):
    """The shipped policies capture under the guard, plain and as real-time-chunking runners."""
    model = load_policy(WEIGHTS / f"{name}.json")
    for runner in (PolicyRunner(model, backend="jit"), RTCPolicyRunner(model, backend="jit")):
        assert runner.graph.phase == "captured"
        runner.close()


@pytest.mark.parametrize("name", ["pushblock_critic", "mt10_critic"])
def test_shipped_critics_pass_the_guard(name):
    """The shipped critics capture under the guard."""
    runner = CriticRunner(load_critic(CRITICS / f"{name}.json"), backend="jit")
    assert runner.graph.phase == "captured"
    runner.close()


def test_the_sampler_that_failed_cuda_capture_is_refused_on_cpu(monkeypatch):
    """The advantage pair built with torch.tensor inside the sampler (what failed every CUDA capture) is refused on CPU."""

    def host_built_prefix(self, images, state, tokens):
        adv = torch.tensor([ADV_POSITIVE, ADV_DROPPED], device=state.device)
        return self._prefix(
            [img.expand(2, -1, -1, -1) for img in images], state.expand(2, -1), tokens.expand(2, -1), adv
        )

    monkeypatch.setattr(FlowVLA, "cfg_prefix", host_built_prefix)
    with pytest.raises(
        CaptureHazard,
        match=r"policy: cannot capture: aten\.lift_fresh .* at policies/test_capture_guard\.py:\d+ in host_built_prefix",
    ):
        PolicyRunner(load_policy(), backend="jit")
