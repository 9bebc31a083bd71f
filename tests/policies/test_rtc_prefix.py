"""Real-time chunking's trained hard-prefix variant: the config flag, per-token flow time, the inpainting sampler,
its runner, and the masked fine-tuning loss."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rollcap.policies import FlowVLA, FlowVLAConfig, PolicyRunner
from rollcap.policies.rtc import RTCPolicyRunner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.learn.train_prefix import prefix_loss, prefix_model
from tests.rollout._tiny import POLICY, first_obs as _obs, flow_noise as _noise, make_env

PREFIX = dataclasses.replace(POLICY, prefix_conditioning=True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return FlowVLA(PREFIX).eval()


@pytest.fixture(scope="module")
def pair(model):
    plain, rtc = PolicyRunner(model), RTCPolicyRunner(model)
    yield plain, rtc
    plain.close()
    rtc.close()


def test_the_flag_is_omitted_from_a_plain_config_and_round_trips_when_set():
    """A plain config's JSON (and so the shipped checkpoint's fingerprint) has no new field; a prefix one keeps it."""
    assert "prefix_conditioning" not in FlowVLAConfig().to_json()
    js = PREFIX.to_json()
    assert js["prefix_conditioning"] is True and FlowVLAConfig.from_json(js) == PREFIX
    with pytest.raises(ValueError, match="prefix_conditioning"):
        FlowVLAConfig.from_json({**js, "prefix_conditioning": 1})


def test_per_token_time_of_equal_values_is_the_per_chunk_time(model):
    """The expert's [B, H] time path computes what the [B] path does when every token has the same time."""
    torch.manual_seed(1)
    obs = make_env().reset(seed=1)[0]
    spec = POLICY.obs_spec.to_inputs(obs)
    kv, valid = model.cfg_prefix(
        [torch.from_numpy(spec["image_front"])], torch.from_numpy(spec["state"]), torch.from_numpy(spec["tokens"])
    )
    x = torch.randn(2, POLICY.horizon, POLICY.action_dim)
    t = torch.tensor([0.7, 0.3])
    a = model.expert(x, t, kv, valid)
    b = model.expert(x, t[:, None].expand(2, POLICY.horizon), kv, valid)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    c = model.expert(x, torch.tensor([[0.0] + [0.7] * (POLICY.horizon - 1), [0.3] * POLICY.horizon]), kv, valid)
    assert not torch.allclose(a[0], c[0])  # a token's own time matters


def test_the_runner_picks_the_prefix_sampler_from_the_checkpoint(pair):
    """Auto-detected sampler in the fingerprint; with nothing carried the chunk is the plain runner's bit for bit."""
    plain, rtc = pair
    fp = rtc.state_fingerprint()
    assert fp["rtc_sampler"] == "prefix" and fp["config"]["prefix_conditioning"] is True
    rtc.configure(1, 2, "rtc")
    obs, noise = _obs(), _noise(1)
    assert rtc.act(obs, noise).tobytes() == plain.act(obs, noise).tobytes()


def test_the_carried_prefix_is_pinned_exactly_and_conditions_the_rest(pair):
    """After a commit the next chunk's first d actions are the queue bit for bit; the rest differ from an unpinned chunk;
    the captured graph matches the eager module."""
    _, rtc = pair
    rtc.configure(2, 2, "rtc")
    obs = _obs(3)
    first = rtc.act(obs, _noise(2))
    queue = rtc.queue()
    eager = rtc.act_eager(obs, _noise(3))
    second = rtc.act(obs, _noise(3))
    assert second.tobytes() == eager.tobytes()
    assert queue.tobytes() == first[2:4].tobytes() and second[:2].tobytes() == queue.tobytes()
    rtc.configure(2, 2, "naive")  # the same runner, nothing pinned
    rtc.act(obs, _noise(2))
    free = rtc.act(obs, _noise(3))
    assert not np.array_equal(free[:2], second[:2]) and not np.array_equal(free[2:], second[2:])


def test_the_prefix_sampler_is_refused_where_it_does_not_apply(model, pair):
    """A plain checkpoint cannot take it; a soft mask is refused by the runner and, naming rtc_mask, by the host."""
    _, rtc = pair
    with pytest.raises(ValueError, match="prefix_conditioning"):
        RTCPolicyRunner(FlowVLA(POLICY), backend="eager", sampler="prefix")
    with pytest.raises(ValueError, match="hard"):
        rtc.configure(1, 2, "rtc", "soft")
    with pytest.raises(ConfigError, match="rtc_mask"):
        RolloutHost(
            make_env(), rtc, None, HostConfig(chunking="rtc", inference_delay=1, execute_steps=2, rtc_mask="soft")
        )


def test_prefix_loss_feeds_the_clean_prefix_at_time_zero_and_masks_it(model):
    """The expert sees the ground-truth actions at t = 0 on a random-length prefix; the loss has no gradient there."""
    torch.manual_seed(2)
    train = prefix_model(model).train()
    assert not any(p.requires_grad for p in train.encoder.parameters())
    seen = {}
    train.expert.register_forward_pre_hook(lambda m, args: seen.update(x=args[0].detach(), t=args[1].detach()))

    def keep_out(m, args, out):
        out.retain_grad()
        seen["out"] = out

    train.expert.out.register_forward_hook(keep_out)
    b, h, a = 16, POLICY.horizon, POLICY.action_dim
    obs = POLICY.obs_spec.to_inputs(_obs(4))
    images = [torch.from_numpy(obs["image_front"]).expand(b, -1, -1, -1)]
    actions = torch.randn(b, h, a)
    loss = prefix_loss(train, images, torch.from_numpy(obs["state"]).expand(b, -1), torch.from_numpy(obs["tokens"]).expand(b, -1),
                       torch.ones(b, dtype=torch.int64), actions, 3, torch.Generator().manual_seed(0))  # fmt: skip
    loss.backward()
    pre = seen["t"] == 0
    assert pre.any() and (~pre).any() and pre.sum(1).max() <= 3
    assert (pre[:, :-1] | ~pre[:, 1:]).all()  # a prefix: no pinned token after a free one
    assert torch.equal(seen["x"][pre], actions[pre])
    g = seen["out"].grad.abs().sum(-1)
    assert (g[pre] == 0).all() and (g[~pre] > 0).all()
    assert train.expert.in_proj.weight.grad is not None


@pytest.mark.slow
def test_stale_prefix_labels_are_the_training_demos_with_the_plan_rtc_executes():
    """Same episodes as training.py; with max_delay 0 the same labels; otherwise a step's prefix is the clean plan
    labelled s steps earlier (its actions s..s+d-1), and the first s steps of an episode carry none."""
    from rollcap.rollout.learn.train_prefix import collect_prefix_demos
    from rollcap.rollout.learn.training import TrainConfig, collect_demos

    tc = TrainConfig(demos=2, noisy_fraction=0.0, policy=dataclasses.replace(FlowVLAConfig(), image_size=32))
    base = collect_demos(tc)
    same, d0 = collect_prefix_demos(tc, 0, 0.1, seed=1)
    assert not d0.any() and np.array_equal(same.chunks, base.chunks) and np.array_equal(same.images, base.images)
    demos, d = collect_prefix_demos(tc, 4, 0.0, seed=1)
    s = tc.policy.execute_steps
    assert np.array_equal(demos.state, base.state) and np.array_equal(demos.adv, base.adv) and d.max() <= 4
    assert not d[:s].any() and (d > 0).sum() > len(d) // 2
    for j in np.flatnonzero(d):
        assert np.array_equal(demos.chunks[j][: d[j]], base.chunks[j - s][s : s + d[j]]), j
    assert np.array_equal(demos.chunks[d == 0], base.chunks[d == 0])
    assert not np.array_equal(demos.chunks[d > 0], base.chunks[d > 0])
