"""Inputs for a FlowVLA's samplers, two lean samplers compared through every sampler, and a kernel test's script run
under Triton's interpreter: what the Triton kernels' CPU tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from rollcap.kernels.precision import cast_linears
from rollcap.policies.observation import tokenize


def sampler_inputs(cfg, seed: int, n: int = 1, instruction: str = "push the red block to the left"):
    """``n`` observations (images, state, tokens) and noise, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    imgs = [
        torch.randint(0, 256, (n, cfg.image_size, cfg.image_size, 3), dtype=torch.uint8, generator=g)
        for _ in cfg.image_keys
    ]
    state = torch.randn(n, cfg.state_dim, generator=g)
    toks = torch.from_numpy(tokenize(instruction, cfg.max_tokens))[None].expand(n, -1)
    noise = torch.randn(n, cfg.horizon, cfg.action_dim, generator=g)
    return imgs, state, toks, noise


def compare_samplers(a, b, bounds, cast: bool = False) -> dict:
    """max |a - b| of a chunk from ``sample``, ``sample_rows`` (3 rows) and RTC's ``guided_sample``, per dtype.

    ``bounds``: ``(dtype, bound)`` pairs (dtype None: fp32; else under that autocast, the weights cast to it once
    with ``cast``, as the runner stores them on CUDA). Each difference must be above 0 (the two differ) and below
    its bound.
    """
    cfg = a.cfg
    imgs, state, toks, noise = sampler_inputs(cfg, 0)
    carried = torch.randn(1, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(1))
    w = torch.zeros(1, cfg.horizon, 1)
    w[:, :2] = 1.0
    rows = ([i.expand(3, -1, -1, -1) for i in imgs], state.expand(3, -1), toks.expand(3, -1), noise.expand(3, -1, -1))
    calls = (
        ("sample", (imgs, state, toks, noise)),
        ("sample_rows", rows),
        ("guided_sample", (imgs, state, toks, noise, carried, w)),
    )
    diffs = {}
    for dtype, bound in bounds:
        x, y = (cast_linears(a), cast_linears(b)) if dtype is not None and cast else (a, b)
        ctx = torch.autocast("cpu", dtype=dtype, cache_enabled=False) if dtype else torch.autocast("cpu", enabled=False)
        with torch.no_grad(), ctx:
            for name, args in calls:
                d = (getattr(x, name)(*args).float() - getattr(y, name)(*args).float()).abs().max().item()
                assert 0 < d < bound, (name, dtype, d)
                diffs[name, str(dtype)] = d
    return diffs


def run_interpreted(template: str) -> str:
    """Run ``template`` (a script with a ``{tests}`` field: the tests folder, for its imports) in a child Python with
    ``TRITON_INTERPRET=1``; its output, which must start with ``ok`` (the script prints its figures after it)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = template.format(tests=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().startswith("ok"), r.stderr[-3000:]
    return r.stdout


def eager_chunks(cfg, models, precision: str = "fp32") -> list[torch.Tensor]:
    """Each model's eager chunk (on CPU) from the same bench inputs of ``cfg``, as the bench's graphs call it."""
    from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs

    ins, outs = _buffers(cfg, "cpu")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    chunks = []
    for m in models:
        _graph(m, ins, outs, "eager", precision).replay()
        chunks.append(outs["actions"].clone())
    return chunks
