"""What vendor-independent bits would cost: the shipped policy's chunk, CPU time at one thread, under GEMM variants.

rollcap names the CPU kind in the fingerprint (issue 54) instead of making the CPU plan's bits vendor-independent.
This script measures the alternatives, one per process (a library's code path is chosen once a process)::

    for i in 1 2 3; do
      python3 scripts/cross_cpu_cost.py plan                                 # the captured jit plan, MKL as it chooses
      MKL_CBWR=COMPATIBLE python3 scripts/cross_cpu_cost.py plan             # MKL's SSE2 branch (its non-Intel CNR branch)
      python3 scripts/cross_cpu_cost.py eager                                # eager, MKL as it chooses
      python3 scripts/cross_cpu_cost.py exact                                # eager, every GEMM exact (below)
      MKL_ENABLE_INSTRUCTIONS=SSE4_2 python3 scripts/cross_cpu_cost.py exact # ... under another MKL code path
    done

Each prints one JSON line: the median CPU milliseconds of a chunk and a digest of the chunk's bytes. ``exact`` replaces
the policy's GEMMs (linear, attention, the grouped state projection) by integer GEMMs in float64: each operand is
scaled per row by a power of two and cut into two integer slices of ``s`` bits, with ``2s + log2(2K) <= 53``, so
every product and partial sum is an integer below 2**53 and any summation order, blocking or vector width gives the
same result; the slices' products are then combined elementwise in a fixed order. Its GEMMs then no longer follow
MKL's code path, but the chunk's digest still does: ``exp``, ``sin`` and ``cos`` of the flow-time embedding run on
MKL's vector math library (VML), whose kernels follow the CPU too (found with ``rollcap.rollout.offline.opdiff``:
under ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` the first op with equal inputs and other outputs is then ``exp``). A
vendor-independent plan would replace those as well; the GEMMs alone cost what the script prints.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def _slices(a: torch.Tensor, s: int):
    _, e = torch.frexp(a.abs().amax(dim=-1, keepdim=True))  # |a| < 2**e per row
    scaled = torch.ldexp(a, s - e).to(torch.float64)
    hi = torch.trunc(scaled)
    return hi, torch.trunc((scaled - hi) * 2.0**s), e


def exact_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` over the last dims, through integer slices: the same bits whatever kernel sums them."""
    s = (53 - math.ceil(math.log2(2 * x.shape[-1]))) // 2
    xh, xl, ex = _slices(x, s)
    wh, wl, ew = _slices(w, s)
    c = xh @ wh.mT + (torch.cat([xh, xl], -1) @ torch.cat([wl, wh], -1).mT) * 2.0**-s
    return torch.ldexp(c, ex + ew.mT - 2 * s).to(torch.float32)


def exact_linear(x, w, b=None):
    y = exact_mm(x, w)
    return y if b is None else y + b


def exact_attention(q, k, v, attn_mask=None, **_):
    scores = exact_mm(q, k) * (1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return exact_mm(torch.softmax(scores, -1), v.transpose(-1, -2))


def exact_einsum(eq, feats, w):
    assert eq == "bgf,gfw->bgw", eq  # the one einsum of the shipped models (the grouped state projection)
    return exact_mm(feats.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1)


def cpu_ms(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return 1e3 * float(np.median(times))


def main(variant: str) -> None:
    import rollcap.policies.layers as layers
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners

    policy, _ = make_runners(Parts(critic=None))
    obs, _ = make_env().reset(seed=0)
    noise = np.random.default_rng(0).standard_normal(policy.noise_shape[1:]).astype(np.float32)
    if variant == "plan":
        ms = cpu_ms(lambda: policy.act(obs, noise), 60)
        chunk = policy.act(obs, noise)
    else:
        torch.set_num_threads(1)
        values = {k: torch.from_numpy(v) for k, v in policy._inputs(obs, noise).items()}
        if variant == "exact":
            layers.F.linear = F.linear = exact_linear
            layers.F.scaled_dot_product_attention = F.scaled_dot_product_attention = exact_attention
            layers.torch.einsum = exact_einsum
        ms = cpu_ms(lambda: policy.eager(values), 10 if variant == "exact" else 30)
        chunk = policy.eager(values)["actions"].numpy()
    print(
        json.dumps(
            {
                "variant": variant,
                "chunk_cpu_ms": round(ms, 2),
                "digest": hashlib.sha256(chunk.tobytes()).hexdigest()[:12],
            }
        )
    )
    policy.close()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("plan", "eager", "exact"):
        sys.exit("usage: python3 scripts/cross_cpu_cost.py plan|eager|exact")
    main(sys.argv[1])
