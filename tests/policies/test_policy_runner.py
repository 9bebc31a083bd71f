"""PolicyRunner: captured == eager, determinism across calls/processes/threads, bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from rollcap.kernels import BadInput, CheckpointMismatch, capture_count
from rollcap.policies import FlowVLAConfig, PolicyRunner, load_policy, save_policy, tokenize
from tests.helpers import TINY_POLICY, make_noise, make_obs, tiny_policy


@pytest.fixture(scope="module", params=["eager", "jit"])
def runner(request):
    r = PolicyRunner(tiny_policy(), backend=request.param)
    yield r
    r.close()


def test_captured_equals_eager_reference_bytes(runner):
    """The replayed chunk equals the plain-module reference byte-for-byte (CPU jit plan too)."""
    for s in range(4):
        obs, noise = make_obs(s), make_noise(s)
        assert runner.act(obs, noise).tobytes() == runner.act_eager(obs, noise).tobytes()


def test_same_inputs_same_bytes_and_noise_matters(runner):
    """Repeated calls are identical; different noise gives a different chunk."""
    obs = make_obs(1)
    a = runner.act(obs, make_noise(1))
    runner.act(make_obs(2), make_noise(2))
    assert runner.act(obs, make_noise(1)).tobytes() == a.tobytes()
    assert not np.array_equal(runner.act(obs, make_noise(3)), a)


def test_instruction_changes_the_chunk(runner):
    """The instruction reaches the model (the byte tokenizer is wired in)."""
    obs = make_obs(1)
    other = dict(obs, instruction="push the blue block right")
    assert not np.array_equal(runner.act(obs, make_noise(1)), runner.act(other, make_noise(1)))


_CHILD = """
import hashlib, sys, torch
sys.path.insert(0, {root!r})
from tests.helpers import tiny_policy, make_obs, make_noise
from rollcap.policies import PolicyRunner
torch.set_num_threads({threads})
r = PolicyRunner(tiny_policy(), backend='jit')
print(hashlib.sha256(b''.join(r.act(make_obs(s), make_noise(s)).tobytes() for s in range(3))).hexdigest())
"""


@pytest.mark.slow
def test_second_process_and_thread_counts_give_identical_bytes(runner):
    """A fresh process (1 and 2 intra-op threads) reproduces the same chunk bytes."""
    import pathlib

    root = str(pathlib.Path(__file__).resolve().parents[2])
    here = hashlib.sha256(b"".join(runner.act(make_obs(s), make_noise(s)).tobytes() for s in range(3))).hexdigest()
    for threads in (1, 2):
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(root=root, threads=threads)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == here


def test_replays_never_recapture(runner):
    """1,000 replays with changing inputs leave the capture counter unchanged."""
    before = capture_count()
    for s in range(1000):
        runner.act(make_obs(s % 7), make_noise(s))
    assert capture_count() == before


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda o, n: (dict(o, image_front=o["image_front"][:16]), n), "image_front.*expected uint8"),
        (lambda o, n: (dict(o, image_front=o["image_front"].astype(np.float32)), n), "image_front.*expected uint8"),
        (lambda o, n: (dict(o, state=o["state"].astype(np.float64)), n), "state.*expected float32"),
        (lambda o, n: (dict(o, state=np.full(5, np.inf, np.float32)), n), "state.*NaN or Inf"),
        (lambda o, n: (o, np.full_like(n, np.nan)), "noise: contains NaN"),
        (lambda o, n: (o, n[:2]), "noise: expected float32"),
        (
            lambda o, n: (dict(o, instruction="x" * 40), n),
            "instruction: 40 bytes needs 42 tokens, the model's budget is 32",
        ),
        (lambda o, n: ({k: v for k, v in o.items() if k != "state"}, n), "missing \\['state'\\]"),
    ],
)
def test_bad_input_is_refused_before_launch(runner, mutate, match):
    """Bad observations/noise raise BadInput naming the input; buffers stay untouched."""
    runner.act(make_obs(0), make_noise(0))
    before = {k: v.clone() for k, v in runner.live_state().items()}
    obs, noise = mutate(make_obs(5), make_noise(5))
    with pytest.raises(BadInput, match=match):
        runner.act(obs, noise)
    for k, v in runner.live_state().items():
        assert torch.equal(v, before[k]), k


def test_checkpoint_roundtrip_and_mismatch(tmp_path):
    """save/load reproduces the chunk; a checkpoint of another config is refused by name."""
    model = tiny_policy(3)
    save_policy(model, tmp_path / "p")
    loaded = load_policy(tmp_path / "p.json")
    a = PolicyRunner(model, backend="eager").act(make_obs(0), make_noise(0))
    b = PolicyRunner(loaded, backend="eager").act(make_obs(0), make_noise(0))
    assert a.tobytes() == b.tobytes()
    other = FlowVLAConfig(**{**TINY_POLICY.to_json(), "image_keys": ("image_front",), "width": 64})
    with pytest.raises(CheckpointMismatch, match="width: checkpoint 32 vs expected 64"):
        load_policy(tmp_path / "p.json", expect=other)
    meta = json.loads((tmp_path / "p.json").read_text())
    meta["config"]["width"] = 64
    (tmp_path / "p.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match="p.json: meta_digest does not match"):
        load_policy(tmp_path / "p.json")
    del meta["meta_digest"]  # as a checkpoint written before meta_digest: the weights refuse it
    (tmp_path / "p.json").write_text(json.dumps(meta))
    with pytest.raises(
        CheckpointMismatch, match="tensor .encoder.cam_pos. is \\(1, 4, 32\\).*config needs \\(1, 4, 64\\)"
    ):
        load_policy(tmp_path / "p.json")
    meta["config"]["bogus"] = 1
    (tmp_path / "p.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointMismatch, match="p.json: unknown config fields \\['bogus'\\]"):
        load_policy(tmp_path / "p.json")


@pytest.mark.slow
def test_flow_loss_trains():
    """A few optimiser steps on one batch reduce the flow-matching loss."""
    model = tiny_policy(0).train()
    g = torch.Generator().manual_seed(0)
    b = 16
    images = [torch.randint(0, 256, (b, 32, 32, 3), dtype=torch.uint8, generator=g)]
    state = torch.randn(b, 5, generator=g)
    tokens = torch.from_numpy(np.stack([tokenize(make_obs(0)["instruction"], 32)] * b))
    adv = torch.randint(0, 2, (b,), generator=g)
    actions = torch.rand(b, 4, 2, generator=g) * 2 - 1
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model.loss(images, state, tokens, adv, actions, torch.Generator().manual_seed(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.cuda
def test_cuda_graph_policy_equals_eager():
    """On CUDA the graph replay equals eager on the same device byte-for-byte."""
    r = PolicyRunner(tiny_policy(), device="cuda")
    for s in range(3):
        assert r.act(make_obs(s), make_noise(s)).tobytes() == r.act_eager(make_obs(s), make_noise(s)).tobytes()
