"""The real-time-chunking runner: guided sampling over static buffers, the carried prefix, its capsule state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.kernels.graph import capture_count
from rollcap.policies import FlowVLA, PolicyRunner
from rollcap.policies.rtc import RTCPolicyRunner, prefix_weights, rtc_twin
from tests.rollout._tiny import POLICY, first_obs as _obs, flow_noise as _noise


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    model = FlowVLA(POLICY).eval()
    plain, rtc = PolicyRunner(model), RTCPolicyRunner(model)
    yield plain, rtc
    plain.close()
    rtc.close()


def test_prefix_weights_follow_the_papers_soft_mask():
    """1 over the delay, a decay over the rest of the overlap, 0 where the previous chunk has no plan."""
    w = prefix_weights(8, 4, 2)
    assert w[:2].tolist() == [1.0, 1.0] and (w[4:] == 0).all()
    assert 1.0 > w[2] > w[3] > 0.0
    assert (prefix_weights(8, 4, 0)[:4] > 0).all() and prefix_weights(8, 8, 0).sum() == 0
    assert prefix_weights(8, 4, 2, "hard").tolist() == [1, 1, 0, 0, 0, 0, 0, 0]


def test_zero_weights_give_the_plain_chunk_bit_for_bit(pair):
    """With nothing carried (a fresh schedule) the guided graph returns exactly the plain runner's chunk."""
    plain, rtc = pair
    rtc.configure(1, 2, "rtc")
    obs, noise = _obs(), _noise(1)
    assert rtc.act(obs, noise).tobytes() == plain.act(obs, noise).tobytes()


def test_a_committed_chunk_is_carried_pins_the_next_prefix_and_is_capsule_state(pair):
    """result() commits chunk[s:] as the targets; weight 1 pins the delay's actions; the carried buffers round-trip."""
    _, rtc = pair
    rtc.configure(1, 2, "rtc")
    obs = _obs(3)
    first = rtc.act(obs, _noise(2))
    st = rtc.carried_state()
    assert st["carried_n"] == 2 and np.array_equal(st["carried"][:2], first[2:]) and not st["carried"][2:].any()
    assert np.array_equal(rtc.queue(), first[2:3])
    saved = {k: v.clone() for k, v in rtc.live_state().items()}
    second = rtc.act(obs, _noise(3))
    np.testing.assert_allclose(second[0], first[2], atol=1e-5)  # the delay's action is pinned to the queue
    assert rtc.act_eager(obs, _noise(3)) is not None
    rtc.load_live_state(saved)
    assert np.array_equal(rtc.act(obs, _noise(3)), second)  # restoring the capsule state reproduces the chunk


def test_eager_and_captured_guided_chunks_are_identical(pair):
    """The captured plan of the guided sampler is bit-identical to the plain module on CPU."""
    _, rtc = pair
    rtc.configure(2, 2, "rtc")
    obs = _obs(4)
    rtc.act(obs, _noise(5))
    eager = rtc.act_eager(obs, _noise(6))
    assert rtc.act(obs, _noise(6)).tobytes() == eager.tobytes()


def test_configure_refuses_a_schedule_that_does_not_fit(pair):
    """The delay must fit the execution horizon and the chunk; guidance must be known."""
    _, rtc = pair
    for d, s in ((3, 2), (1, 4), (-1, 2)):
        with pytest.raises(ValueError, match="inference delay"):
            rtc.configure(d, s)
    with pytest.raises(ValueError, match="guidance / mask"):
        rtc.configure(1, 2, "bogus")


def test_rtc_twin_shares_model_and_lane_and_is_built_once(pair):
    """Replay's twin of a plain runner is one RTC runner over the same weights and lane."""
    plain, _ = pair
    before = capture_count()
    twin = rtc_twin(plain)
    assert rtc_twin(plain) is twin and twin.lane is plain.lane and twin.model is plain.model
    assert capture_count() == before + 1 and rtc_twin(twin) is twin


@pytest.mark.cuda
def test_the_guided_sampler_captures_as_a_cuda_graph():
    """On a GPU the carrying runner captures a CUDA graph, pins the delay's actions and matches its eager path."""
    torch.manual_seed(0)
    rtc = RTCPolicyRunner(FlowVLA(POLICY).eval(), device="cuda")
    try:
        assert rtc.backend == "cuda"
        rtc.configure(1, 2, "rtc")
        obs = _obs(7)
        first = rtc.act(obs, _noise(8))
        eager = rtc.act_eager(obs, _noise(9))
        second = rtc.act(obs, _noise(9))
        np.testing.assert_allclose(second[0], first[2], atol=1e-5)
        np.testing.assert_allclose(second, eager, atol=1e-5)
    finally:
        rtc.close()


def test_the_papers_pigdm_guidance_runs_eager_only_and_pulls_towards_the_prefix(pair):
    """The comparison sampler: refused on a captured backend; with nothing carried it is the plain chunk; it pulls index 0 to the queue."""
    plain, _ = pair
    with pytest.raises(ValueError, match="eager"):
        RTCPolicyRunner(plain.model, sampler="pigdm")
    pig = RTCPolicyRunner(plain.model, backend="eager", sampler="pigdm")
    try:
        pig.configure(1, 2, "rtc")
        obs = _obs(5)
        first = pig.act(obs, _noise(10))
        assert first.tobytes() == plain.act(obs, _noise(10)).tobytes()
        free = plain.act(obs, _noise(11))
        guided = pig.act(obs, _noise(11))
        assert abs(guided[0] - first[2]).max() < abs(free[0] - first[2]).max()
        assert pig.state_fingerprint()["rtc_sampler"] == "pigdm"
    finally:
        pig.close()
