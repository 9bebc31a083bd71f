"""CriticRunner: captured == eager, determinism, bad input, training signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.critics import CriticRunner, load_critic, save_critic
from rollcap.kernels import BadInput, CheckpointMismatch
from tests.helpers import make_obs, tiny_critic


@pytest.fixture(scope="module", params=["eager", "jit"])
def runner(request):
    r = CriticRunner(tiny_critic(), backend=request.param)
    yield r
    r.close()


def test_captured_equals_eager_and_itself(runner):
    """The replayed value equals the reference and repeats exactly."""
    for s in range(4):
        v = runner.value(make_obs(s))
        assert v == runner.value_eager(make_obs(s))
        assert -1.0 <= v <= 0.0
    assert runner.value(make_obs(0)) == runner.value(make_obs(0))


def test_bad_observation_is_refused(runner):
    """A wrong-shape image raises BadInput before launch."""
    obs = make_obs(0)
    obs["image_front"] = obs["image_front"][:, :, :2]
    with pytest.raises(BadInput, match="image_front"):
        runner.value(obs)


@pytest.mark.slow
def test_value_loss_learns_targets():
    """Training on two targets separates their predicted values."""
    model = tiny_critic(1).train()
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (8, 32, 32, 3), dtype=torch.uint8, generator=g)]
    state = torch.randn(8, 5, generator=g)
    tokens = torch.full((8, 32), 256, dtype=torch.int64)
    target = torch.tensor([-0.9, -0.1] * 4)
    state[:, 0] = torch.where(target > -0.5, 3.0, -3.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = model.loss(images, state, tokens, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        v = model.eval().value(images, state, tokens)
    assert (v[target > -0.5].min() > v[target < -0.5].max()).item()


def test_checkpoint_roundtrip_and_corruption(tmp_path):
    """save/load round-trips; a truncated weights file is a clear error."""
    m = tiny_critic(2)
    save_critic(m, tmp_path / "c")
    v1 = CriticRunner(m, backend="eager").value(make_obs(3))
    v2 = CriticRunner(load_critic(tmp_path / "c.json"), backend="eager").value(make_obs(3))
    assert v1 == v2
    p = tmp_path / "c.safetensors"
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(CheckpointMismatch, match="c.safetensors: unreadable"):
        load_critic(tmp_path / "c.json")
    with pytest.raises(CheckpointMismatch, match="expected a 'rollcap.ValueCritic' checkpoint"):
        from rollcap.policies import save_policy
        from tests.helpers import tiny_policy

        save_policy(tiny_policy(), tmp_path / "p")
        load_critic(tmp_path / "p.json")


@pytest.mark.cuda
def test_cuda_critic_equals_eager():
    """On CUDA the graph replay equals eager byte-for-byte."""
    r = CriticRunner(tiny_critic(), device="cuda")
    assert r.value(make_obs(0)) == r.value_eager(make_obs(0))
    assert np.isfinite(r.value(make_obs(1)))
