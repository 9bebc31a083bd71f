"""Precision as a deployment setting: fp32 unchanged, bf16 captured == bf16 eager, tf32 refused on CPU, linears cast once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.critics.runner import CriticRunner, load_critic
from rollcap.kernels.precision import cast_linears, check_precision
from rollcap.policies.runner import PolicyRunner, load_policy
from rollcap.rollout.build import make_env


@pytest.fixture(scope="module")
def obs():
    env = make_env()
    o, _ = env.reset(seed=0)
    env.close()
    return o


def _inputs(runner, obs, noise=None):
    ins = {k: torch.from_numpy(v) for k, v in runner.obs_inputs(obs).items()}
    return ins | ({"noise": torch.from_numpy(noise)} if noise is not None else {})


def test_precision_names_are_checked():
    """An unknown precision, and tf32 or fp8 on CPU, are one clear ValueError each."""
    with pytest.raises(ValueError, match="unknown precision 'fp4'"):
        check_precision("fp4", "cpu")
    with pytest.raises(ValueError, match="fp8 needs float8 tensor cores"):
        check_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="tf32 is a CUDA tensor-core mode; on CPU use fp32 or bf16"):
        check_precision("tf32", "cpu")
    with pytest.raises(ValueError, match="policy: tf32 is a CUDA"):
        PolicyRunner(load_policy(), backend="eager", precision="tf32")


def test_bf16_jit_chunk_equals_bf16_eager_and_differs_from_fp32(obs):
    """At bf16 the jit plan's chunk and value equal bf16 eager byte for byte; fp32's fingerprint has no precision field."""
    noise = np.random.default_rng(0).standard_normal((1, 8, 2)).astype(np.float32)
    out = {}
    for precision in ("fp32", "bf16"):
        r = PolicyRunner(load_policy(), backend="jit", precision=precision)
        r.write(r.obs_inputs(obs) | {"noise": noise})
        r.launch()
        out[precision] = r.wait()["actions"].clone()
        assert torch.equal(out[precision], r.eager(_inputs(r, obs, noise))["actions"])
        assert r.state_fingerprint().get("precision") == (None if precision == "fp32" else "bf16")
        r.close()
    assert not torch.equal(out["fp32"], out["bf16"])
    c = CriticRunner(load_critic(), backend="jit", precision="bf16")
    c.write(c.obs_inputs(obs))
    c.launch()
    assert torch.equal(c.wait()["value"], c.eager(_inputs(c, obs))["value"])


def test_linears_cast_once_give_autocasts_bits(obs):
    """bf16 linear weights stored once (what a CUDA runner does) give the same chunk as autocast's per-call casts."""
    noise = np.random.default_rng(1).standard_normal((1, 8, 2)).astype(np.float32)
    model = load_policy()
    r = PolicyRunner(model, backend="eager", precision="bf16")
    want = r.eager(_inputs(r, obs, noise))["actions"]
    r.model = cast_linears(r.model)
    assert r.model.expert.in_proj.weight.dtype == torch.bfloat16 and model.expert.in_proj.weight.dtype == torch.float32
    assert r.model.expert.pos.dtype == torch.float32  # only linears
    assert torch.equal(r.eager(_inputs(r, obs, noise))["actions"], want)


@pytest.mark.cuda
def test_cuda_bf16_runner_casts_linears_and_keeps_the_checkpoints_digest(obs):
    """On CUDA a bf16 runner stores its linears in bf16 once; its fingerprint names the checkpoint's weights; graph == eager."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    noise = np.random.default_rng(2).standard_normal((1, 8, 2)).astype(np.float32)
    fp32 = PolicyRunner(load_policy(), device="cuda", backend="cuda")
    bf16 = PolicyRunner(load_policy(), device="cuda", backend="cuda", precision="bf16")
    assert bf16.model.expert.in_proj.weight.dtype == torch.bfloat16
    assert bf16.state_fingerprint()["weights_digest"] == fp32.state_fingerprint()["weights_digest"]
    bf16.write(bf16.obs_inputs(obs) | {"noise": noise})
    bf16.launch()
    got = bf16.wait()["actions"].clone()
    assert torch.equal(got, bf16.eager({k: v.cuda() for k, v in _inputs(bf16, obs, noise).items()})["actions"])
