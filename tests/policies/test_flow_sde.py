"""The Flow-SDE sampler: captured == eager, exact per-step log-probabilities, host-drawn step noise, new weights in place."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rollcap.kernels import BadInput, capture_count
from rollcap.policies import PolicyRunner, load_policy
from rollcap.policies.flow_sde import FlowSDERunner, schedule, sde_sample, step_logp, step_noise_of
from tests.helpers import TINY_POLICY, make_noise, make_obs, tiny_policy


@pytest.fixture(scope="module", params=[1.5, 1.0], ids=["guided", "beta1"])
def runners(request):
    """A Flow-SDE runner at batch 3 (jit) on the tiny policy, guided (beta 1.5) and conditioned-only (beta 1)."""
    cfg = dataclasses.replace(TINY_POLICY, cfg_beta=request.param)
    r = FlowSDERunner(tiny_policy(cfg=cfg), batch=3)
    yield r
    r.close()


def _inputs(r, rows):
    vals = [r._inputs(make_obs(s), make_noise(s)) for s in rows]
    return {k: torch.from_numpy(np.concatenate([v[k] for v in vals])) for k in vals[0]}


def test_captured_rows_equal_eager_and_logp_is_the_gaussian_density(runners):
    """The jit plan's chunk, trace and log-probabilities equal the eager reference byte for byte; each step's
    log-probability is log N(x_{k+1}; mu_k, std_k) of the trace, computed here from the definition."""
    r = runners
    for i, s in enumerate((0, 1, 2)):
        r.load_row(i, make_obs(s), make_noise(s))
    r.launch()
    out = {k: v.clone() for k, v in r.wait().items()}
    ref = r.eager(_inputs(r, (0, 1, 2)))
    for k in ("actions", "logp", "trace"):
        assert out[k].numpy().tobytes() == ref[k].numpy().tobytes(), k
    trace = out["trace"].double()
    assert torch.equal(out["trace"][:, 0], _inputs(r, (0, 1, 2))["noise"]) and torch.equal(
        out["trace"][:, -1], out["actions"]
    )
    sched = schedule(r.cfg.num_steps, r.noise_level)
    steps = torch.from_numpy(np.stack([step_noise_of(make_noise(s), r.cfg.num_steps) for s in (0, 1, 2)])).double()
    for k in range(r.cfg.num_steps):
        # x_{k+1} - mu_k is std_k * eps_k (the host's step noise): the density is the standard normal's, scaled
        d = trace[:, k + 1].numel() // 3
        want = -0.5 * steps[:, k].square().flatten(1).sum(1) - d * (
            math.log(sched.std[k]) + 0.5 * math.log(2 * math.pi)
        )
        assert torch.allclose(out["logp"][:, k].double(), want, atol=2e-4), k


def test_write_rows_writes_what_load_row_writes_step_noise_included(runners):
    """The batched core's copy-in (every row at once, or some) writes the inputs and keeps the step noise that
    load_row does, row by row."""
    r = runners
    seeds = (6, 7, 8)
    r.write_rows([{**r.obs_inputs(make_obs(s)), "noise": make_noise(s)[None]} for s in seeds])
    got = ({k: v.clone() for k, v in r.inputs.tensors().items()}, [r._steps[i].copy() for i in range(3)])
    for i, s in enumerate(seeds):
        r.load_row(i, make_obs(s), make_noise(s))
    assert all(torch.equal(got[0][k], v) for k, v in r.inputs.tensors().items())
    assert all(np.array_equal(got[1][i], step_noise_of(make_noise(s), r.cfg.num_steps)) for i, s in enumerate(seeds))
    r.write_rows([None, {**r.obs_inputs(make_obs(9)), "noise": make_noise(9)[None]}, None])
    partial = {k: v.clone() for k, v in r.inputs.tensors().items()}
    r.load_row(1, make_obs(9), make_noise(9))
    assert all(torch.equal(partial[k], v) for k, v in r.inputs.tensors().items())
    assert torch.equal(partial["noise"][0], got[0]["noise"][0])


def test_learner_logp_from_the_trace_matches_the_graph(runners):
    """step_logp (every step in one batched call, differentiable) gives the graph's per-step log-probabilities back
    from the recorded trace, to float32 rounding, and a gradient reaches the expert."""
    r = runners
    for i, s in enumerate((3, 4, 5)):
        r.load_row(i, make_obs(s), make_noise(s))
    r.launch()
    out = r.wait()
    model = tiny_policy(cfg=r.cfg)
    x = _inputs(r, (3, 4, 5))
    lp = step_logp(model, [x["image_front"]], x["state"], x["tokens"], out["trace"].clone(), r.noise_level)
    assert lp.shape == (3, r.cfg.num_steps)
    assert torch.allclose(lp, out["logp"], atol=1e-4, rtol=1e-5)
    lp.sum().backward()
    assert model.expert.out.weight.grad is not None and model.expert.out.weight.grad.abs().sum() > 0


def test_step_noise_is_drawn_on_the_host_from_the_chunks_noise(runners):
    """The step noise is a pure function of the chunk's noise bytes (so the recorded noise makes it again); one
    flipped noise bit gives other step noise; the runner's row keeps what it wrote (recorded with the chunk)."""
    r = runners
    a, b = step_noise_of(make_noise(1), 5), step_noise_of(make_noise(1), 5)
    assert a.dtype == np.float32 and a.shape == (5, 4, 2) and a.tobytes() == b.tobytes()
    flipped = make_noise(1).copy()
    flipped.view(np.uint32)[0, 0] ^= 1
    assert not np.array_equal(step_noise_of(flipped, 5), a)
    r.load_row(1, make_obs(1), make_noise(1))
    r.launch()
    r.wait()
    flow = r.row_flow(1)
    assert flow["step_noise"].tobytes() == step_noise_of(make_noise(1), r.cfg.num_steps).tobytes()
    assert flow["logp"].shape == (r.cfg.num_steps,) and flow["trace"].shape == (r.cfg.num_steps + 1, 4, 2)


def test_a_tiny_noise_level_is_the_plain_sampler():
    """As the noise level goes to 0 the SDE's step is the ODE's: the chunk is the plain sampler's (the mean's
    algebra checked against the shipped sampler), and the fingerprint names the sampler and its level."""
    model = tiny_policy()
    plain = PolicyRunner(model, backend="eager")
    sde = FlowSDERunner(tiny_policy(), noise_level=1e-6, backend="eager")
    obs, noise = make_obs(2), make_noise(2)
    assert np.allclose(sde.act(obs, noise), plain.act(obs, noise), atol=1e-4)
    fp = sde.state_fingerprint()
    assert fp["sampler"] == "sde" and fp["noise_level"] == 1e-6 and "sampler" not in plain.state_fingerprint()


def test_refusals_name_the_setting():
    """A noise level out of range, a prefix-conditioned model: one line naming the field."""
    with pytest.raises(ValueError, match=r"^noise_level: expected a number in \(0, 4\]"):
        FlowSDERunner(tiny_policy(), noise_level=0)
    with pytest.raises(ValueError, match=r"^prefix_conditioning: "):
        FlowSDERunner(tiny_policy(cfg=dataclasses.replace(TINY_POLICY, prefix_conditioning=True)))


@pytest.fixture(scope="module")
def shipped_sde():
    r = FlowSDERunner(load_policy(), batch=2)
    yield r
    r.close()


def _obs(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"image_front": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
            "state": rng.standard_normal(28).astype(np.float32), "instruction": "push the red block to the green target"}  # fmt: skip


def test_new_weights_in_place_equal_an_eager_chunk_with_them(shipped_sde):
    """load_weights copies new weights into the captured jit plan's parameters: the capture count does not move,
    the next chunk is byte-equal to an eager chunk of a fresh model with those weights, and the fingerprint names
    their digest (the checkpoint digest of the same tensors)."""
    r, before = shipped_sde, capture_count()
    new = load_policy()
    with torch.no_grad():
        for p in new.expert.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    old_digest = r.state_fingerprint()["weights_digest"]
    digest = r.load_weights(new.state_dict())
    assert capture_count() == before and digest != old_digest and r.state_fingerprint()["weights_digest"] == digest
    noise = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
    r.load_row(0, _obs(0), noise)
    r.load_row(1, _obs(1), noise)
    r.launch()
    got = r.wait()["actions"][0].clone()
    ref = FlowSDERunner(new, backend="eager", batch=2)
    x = {
        k: torch.from_numpy(np.concatenate([ref._inputs(_obs(s), noise)[k] for s in (0, 1)])) for k in ref.inputs.names
    }
    assert got.numpy().tobytes() == ref.eager(x)["actions"][0].numpy().tobytes()
    back = r.load_weights(load_policy().state_dict())
    assert back == old_digest


def test_bad_weights_are_refused_and_leave_the_live_ones(shipped_sde):
    """A missing name or a wrong shape is one BadInput line; the weights the graph reads are untouched."""
    r = shipped_sde
    live = {k: v.clone() for k, v in r.model.state_dict().items()}
    sd = load_policy().state_dict()
    bad = dict(sd)
    bad.pop(next(iter(bad)))
    with pytest.raises(BadInput, match="new weights lack"):
        r.load_weights(bad)
    wrong = dict(sd)
    name = next(k for k, v in sd.items() if v.dim() == 2)
    wrong[name] = torch.zeros(3, 3)
    with pytest.raises(BadInput, match=rf"new weights\['{name}'\] is torch.float32 \(3, 3\)"):
        r.load_weights(wrong)
    assert all(torch.equal(v, live[k]) for k, v in r.model.state_dict().items())


@pytest.mark.cuda
def test_cuda_graph_sde_equals_eager_and_takes_weights_in_place():
    """On CUDA the captured Flow-SDE graph equals eager on the device, and new weights copied in place reach the next
    replay with no recapture."""
    r = FlowSDERunner(tiny_policy(), device="cuda", batch=2)
    before = capture_count()
    for s in range(2):
        assert r.act(make_obs(s), make_noise(s)).tobytes() == r.act_eager(make_obs(s), make_noise(s)).tobytes()
    new = tiny_policy(seed=1)
    r.load_weights(new.state_dict())
    ref = FlowSDERunner(tiny_policy(seed=1), device="cuda", backend="eager")
    assert capture_count() == before
    assert r.act(make_obs(0), make_noise(0)).tobytes() == ref.act_eager(make_obs(0), make_noise(0)).tobytes()


def test_sde_sample_is_the_runner_graph():
    """sde_sample is the function the runner captures (a direct call equals the runner's eager reference)."""
    model = tiny_policy()
    r = FlowSDERunner(model, backend="eager")
    x = _inputs(r, (6,))
    with torch.no_grad():
        a, lp, tr = sde_sample(
            model, [x["image_front"]], x["state"], x["tokens"], x["noise"], x["step_noise"], r.noise_level
        )
    ref = r.eager(x)
    assert torch.equal(a, ref["actions"]) and torch.equal(lp, ref["logp"]) and torch.equal(tr, ref["trace"])
