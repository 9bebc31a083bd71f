"""A small expert's whole Euler step in one kernel (kernels/expert_step.py) against the lean sampler's own step.

The lean step runs on CPU everywhere (a lean sampler built with ``step_kernel`` is the lean sampler's bytes there).
The Triton kernel runs on CPU through Triton's interpreter (``TRITON_INTERPRET=1``, in a child process) where
``triton`` imports, and skips cleanly where it does not (CI); it is compiled ahead of time for sm90 without a GPU;
the cuda-marked test runs it compiled and captures it in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from rollcap.kernels import expert_step as S
from rollcap.policies.lean import lean
from rollcap.policies.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.runner import load_policy
from rollcap.policies.sizes import SIZES, build, size_config
from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs
from tests.kernels._sampling import eager_chunks, run_interpreted, sampler_inputs

_TRITON = importlib.util.find_spec("triton") is not None


def _step_operands(model, rows=1, seed=0):
    """One step's operands of a lean ``model`` (both guidance branches of ``rows`` observations): the noisy actions,
    the step's bias, the prefix keys/values with room, the key mask."""
    cfg = model.cfg
    imgs, state, tokens, _ = sampler_inputs(cfg, seed, rows)
    with torch.no_grad():
        kv, mask = model._guided(imgs, state, tokens, rows=rows if rows > 1 else None)
    x = torch.randn(2 * rows, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(seed + 1))
    return x, model.expert.step_bias[3], kv, mask


def test_which_experts_and_operands_the_kernel_takes():
    """The shipped expert fits; the wider sizes are refused by their shape before anything is built (the sweep's
    check), and a step's operands are checked by name."""
    assert S.config_fits(SIZES["shipped"]) is None
    for name in ("26m", "205m", "3b"):
        assert S.config_fits(SIZES[name]).startswith("expert width"), name
    assert "horizon 50" in S.config_fits(dataclasses.replace(SIZES["shipped"], horizon=50))
    assert "MLP width" in S.config_fits(dataclasses.replace(SIZES["shipped"], mlp_ratio=3, width=32, heads=2))
    assert "head_dim 8" in S.config_fits(dataclasses.replace(SIZES["shipped"], heads=16))
    m = lean(load_policy(DEFAULT_CHECKPOINT), step_kernel=True)
    assert S.expert_fits(m.expert) is None
    x, bias, kv, mask = _step_operands(m)
    assert S.step_fits(m.expert, x, bias, kv, mask) is None
    assert S.step_fits(m.expert, x, bias[None].expand(2, -1, -1), kv, mask) is None  # a bias per batch row
    assert "batch 3" in S.step_fits(m.expert, x, bias[None].expand(3, -1, -1), kv, mask)
    assert "one additive key row" in S.step_fits(m.expert, x, bias, kv, mask.expand(2, 1, 8, -1))
    assert "kv:" in S.step_fits(m.expert, x, bias, kv.double(), mask)
    assert "x:" in S.step_fits(m.expert, x[..., :1], bias, kv, mask)
    assert S.step_fits(m.expert, x[:1], bias, kv, mask) is None  # one env row read by both branches' programs
    assert "must divide" in S.step_fits(m.expert, torch.cat([x, x[:1]]), bias, kv, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast to torch.bfloat16 over torch.float32" in S.step_fits(m.expert, x, bias, kv, mask)


def test_cpu_takes_the_lean_step_and_says_nothing_in_the_fingerprint():
    """On CPU a lean sampler built with the step kernel is the lean sampler's bytes and fingerprint; the kernel is
    named in a fingerprint only on a device it runs on and for an expert it fits."""
    plain = load_policy(DEFAULT_CHECKPOINT)
    a, b = lean(plain), lean(plain, step_kernel=True)
    assert b.expert.step_kernel and a.fingerprint_facts("cpu") == b.fingerprint_facts("cpu")
    cfg = plain.cfg
    assert torch.equal(*eager_chunks(cfg, (a, b)))
    wide = lean(build(dataclasses.replace(size_config("26m"), depth=1, image_size=16)), step_kernel=True)
    assert S.step_facts(wide.expert, "cuda") == {}  # too wide: the lean step runs there too
    assert b.expert.stacked() is b.expert.stacked()  # made once; again only when the weights are replaced


def test_stacked_weights_follow_a_cast():
    """The stacked copy the kernel reads is made again when the weights are cast (the runner casts after building)."""
    from rollcap.kernels.precision import cast_linears

    m = lean(load_policy(DEFAULT_CHECKPOINT), step_kernel=True)
    assert m.expert.stacked()["qkv_w"].dtype == torch.float32
    c = cast_linears(m)
    st = c.expert.stacked()
    assert st["qkv_w"].dtype == torch.bfloat16 and st["fc2_b"].shape == (3, 128)
    assert torch.equal(st["fc1_w"][2], c.expert.blocks[2].fc1.weight)


_INTERPRETED = textwrap.dedent(
    """
    import copy, dataclasses, sys, torch
    sys.path.insert(0, {tests!r})
    from rollcap.kernels import expert_step as S
    from rollcap.kernels.precision import cast_linears
    from rollcap.policies.lean import lean
    from rollcap.policies.runner import DEFAULT_CHECKPOINT, load_policy
    from rollcap.policies.sizes import SIZES, build
    from kernels.test_expert_step import _step_operands
    assert S._HAVE_TRITON
    S.KERNEL_DEVICES = ("cuda", "cpu")
    # one step against the lean step: the shipped checkpoint, and a random expert at the kernel's widest shape
    # (width 256, 8 heads, MLP 1024, 16 actions of 14 dims, two batch rows), in fp32 and in bf16 (weights cast,
    # under autocast: the runner's bf16)
    wide = dataclasses.replace(SIZES["shipped"], width=256, heads=8, mlp_ratio=4, horizon=16, action_dim=14, depth=2)
    errs = {{}}
    for name, plain in (("shipped", load_policy(DEFAULT_CHECKPOINT)), ("wide", build(wide))):
        for dtype, bound in ((torch.float32, 2e-6), (torch.bfloat16, 2.0**-7)):
            m = lean(plain, step_kernel=True)
            m = m if dtype == torch.float32 else cast_linears(m)
            ctx = torch.autocast("cpu", dtype=dtype, cache_enabled=False, enabled=dtype != torch.float32)
            with torch.no_grad(), ctx:
                for rows, bias_rows in ((1, False), (3, False), (1, True)):
                    x, bias, kv, mask = _step_operands(m, rows=rows)
                    if bias_rows:  # a step bias per batch row (prefix-conditioned sampling's)
                        bias = bias[None] + torch.randn(x.shape[0], *bias.shape, generator=torch.Generator().manual_seed(1))
                    assert S.step_fits(m.expert, x, bias, kv, mask) is None
                    m.expert.step_kernel = False
                    ref = m.expert(x, bias, kv, mask)
                    m.expert.step_kernel = True
                    got = m.expert(x, bias, kv, mask)
                    assert got.dtype == ref.dtype == dtype and got.shape == ref.shape
                    err = (got.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                    assert err <= bound, (name, dtype, rows, bias_rows, err)
                    errs[name, str(dtype), rows, bias_rows] = err
                    if dtype == torch.bfloat16 and rows == 1 and not bias_rows:  # both against a float64 step
                        m64 = copy.deepcopy(m).double()
                        m64.expert.step_kernel = False
                        with torch.autocast("cpu", enabled=False):
                            exact = m64.expert(x.double(), bias.double(), kv.double(), mask.double())
                        e_got, e_ref = ((t.double() - exact).abs().max().item() / exact.abs().max().item() for t in (got, ref))
                        assert e_got <= 2 * e_ref, (name, e_got, e_ref)
                        errs[name, "vs float64: kernel, lean step"] = (e_got, e_ref)
                    # the env rows once, read by both branches' programs: the repeated rows' velocities
                    n = x.shape[0] // 2
                    assert torch.equal(S.expert_step(m.expert, x[:n], bias, kv, mask),
                                       S.expert_step(m.expert, x[:n].repeat(2, 1, 1), bias, kv, mask))
                    # one mask row for every batch row reads the same row
                    assert torch.equal(S.expert_step(m.expert, x, bias, kv, mask[:1].expand_as(mask)),
                                       S.expert_step(m.expert, x, bias, kv, mask[:1]))
    # the shipped checkpoint's samplers with the kernel at every step, against without
    from kernels._sampling import compare_samplers
    plain = load_policy(DEFAULT_CHECKPOINT)
    b = lean(plain, step_kernel=True)
    diffs = compare_samplers(lean(plain), b, ((None, 1e-5), (torch.bfloat16, 0.01)), cast=True)
    assert "expert_step" in b.fingerprint_facts("cpu")
    print("ok", errs, diffs)
    """
)


@pytest.mark.skipif(not _TRITON, reason="triton is not installed (CI): the lean step is tested above")
def test_the_kernel_matches_the_lean_step_in_the_interpreter():
    """The Triton kernel on CPU (TRITON_INTERPRET=1) against the lean step: within 2e-6 (fp32) or 2^-7 (bf16: its
    probabilities and its per-head output products round otherwise) of the largest velocity, at the shipped
    checkpoint and at the kernel's widest shape, batch 2 and 6, with a shared or a per-row step bias; at bf16 no
    further from a float64 step than twice the lean step's own error; one copy of the env rows gives the repeated
    rows' velocities; the shipped checkpoint's sample, sample_rows and guided sampling with it at every step within
    1e-5 of without (fp32) or 0.01 (bf16)."""
    run_interpreted(_INTERPRETED)


@pytest.mark.cuda
def test_the_kernel_on_cuda_and_in_a_cuda_graph():
    """On a GPU: the shipped size's lean sampler with the step kernel, captured in a CUDA graph, equals its own eager
    chunk byte for byte at fp32 and bf16, and stays near the lean sampler's chunk."""
    from rollcap.kernels.ops import triton_available

    if not triton_available():
        pytest.skip("triton is not importable")
    cfg = size_config("shipped")
    plain = build(cfg, "cuda")
    ins, outs = _buffers(cfg, "cuda")
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    for precision, bound in (("fp32", 1e-4), ("bf16", 0.05)):
        chunks = []
        for m in (lean(plain), lean(plain, step_kernel=True)):
            eager = _graph(m, ins, outs, "eager", precision)
            eager.replay()
            want = outs["actions"].clone()
            g = _graph(m, ins, outs, "cuda", precision)
            g.replay()
            assert torch.equal(outs["actions"], want), precision
            chunks.append(want)
        assert (chunks[0] - chunks[1]).abs().max().item() < bound, precision


@pytest.mark.skipif(not _TRITON, reason="triton is not installed (CI)")
@pytest.mark.parametrize(("dtype", "width", "heads", "mlp", "actions"), [("bf16", 128, 4, 256, 2), ("fp32", 128, 4, 256, 2), ("bf16", 256, 8, 1024, 14)])  # fmt: skip
def test_the_kernel_compiles_for_an_h100_without_one(dtype, width, heads, mlp, actions, tmp_path):
    """Triton compiles the kernel ahead of time for sm90 (its bundled ptxas; no GPU needed), at the shipped shape and
    the widest the kernel takes: a shape or dtype the GPU's compiler refuses fails here, not in a device session.
    bf16 products take tensor cores (``mma``), and at bf16 nothing spills to the stack (its bundled cuobjdump reads
    the registers and stack a thread uses)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    floats = ("x_ptr", "bias_ptr")
    ints = (
        "x_rows",
        "s_x_b",
        "s_x_h",
        "s_bias_b",
        "s_kv_l",
        "s_kv_b",
        "s_kv_n",
        "s_m_b",
        "s_v_b",
        "s_v_h",
        "h_len",
        "n_prefix",
    )
    const = {
        **{"L": 3, "W": width, "A": actions, "HEADS": heads, "D": width // heads, "M": mlp},
        **{"BM": S.BLOCK_M, "BC": S.BLOCK_C, "BN": S.BLOCK_N, "WIDEN": False},
        "PREC": "ieee" if dtype == "fp32" else "tf32",
    }
    sig = {}
    for name in S._expert_step_kernel.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in ints:
            sig[name] = "i32"
        elif name in ("eps1", "eps2", "eps_out", "scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "*fp32" if name in floats else f"*{dtype}"
    k = triton.compile(
        ASTSource(S._expert_step_kernel, sig, const),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": S.NUM_WARPS},
    )
    assert k.asm["cubin"] and (("mma" in k.asm["ptx"]) == (dtype == "bf16"))
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if tool.exists():
        (tmp_path / "k.cubin").write_bytes(k.asm["cubin"])
        usage = subprocess.run([str(tool), "-res-usage", str(tmp_path / "k.cubin")], capture_output=True, text=True)
        line = next(x for x in usage.stdout.splitlines() if "REG:" in x)
        print(dtype, width, line.strip())  # the figures BENCHMARKS quotes (pytest -s)
        assert dtype != "bf16" or " STACK:0 " in line, line
