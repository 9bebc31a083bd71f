"""The kernel table's categories (issue 42): names from an H100 profile and ATen ops, and a CPU profile's shape."""

from __future__ import annotations

import torch

from rollcap.policies.lean import lean
from rollcap.policies.sizes import build, size_config
from rollcap.rollout.bench.model_sizes import _inputs
from rollcap.rollout.bench.kernel_profile import CATEGORIES, PHASES, category, phase_split, profile_replays


def test_kernel_names_fall_in_the_issues_categories():
    cases = {
        ("nvjet_tst_128x64_64x4_1x2_h_bz_splitK_TNT", ()): "GEMM",  # a split-K GEMM is a GEMM ...
        ("void splitKreduce_kernel<32, 16, int, float>", ()): "split-K reduce",  # ... its reduce is not
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", ()): "attention",
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
            (),
        ): "elementwise add",
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", ()): "norm",
        ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", ()): "GELU",
        ("_add_ln_kernel", ()): "add+norm (fused)",
        ("_cfg_euler_kernel", ()): "CFG step",
        ("_expert_attn_kernel", ("aten::copy_",)): "attention",  # the lean expert's attention kernel (no copy)
        ("_expert_step_kernel", ("aten::empty",)): "expert step (fused)",  # a small expert's whole step
        ("direct_copy_kernel_cuda", ("aten::copy_", "aten::_to_copy", "aten::linear")): "cast",
        ("direct_copy_kernel_cuda", ("aten::copy_",)): "copies",
        ("aten::addmm", ()): "GEMM",
        ("aten::native_layer_norm", ()): "norm",
        ("aten::mul", ()): "other",
    }
    for (name, ops), want in cases.items():
        assert category(name, ops) == want, name
    assert set(cases.values()) <= set(CATEGORIES)


def test_a_cpu_profile_groups_aten_ops_by_self_time():
    x, w = torch.randn(64, 256), torch.randn(256, 256)

    def call():
        torch.nn.functional.layer_norm(x @ w + x, (256,))

    p = profile_replays(call, "cpu", replays=2)
    assert p["source"].startswith("ATen ops") and p["replays"] == 2
    cats = p["categories"]
    assert {"GEMM", "norm", "elementwise add"} <= set(cats) and cats["GEMM"][
        "ms"
    ] > 0  # ops, views and all, by their launching chain
    assert abs(sum(c["share"] for c in cats.values()) - 1.0) < 1e-6
    assert p["top"][0]["ms"] >= p["top"][-1]["ms"]


def test_a_phase_split_tells_the_prefix_from_the_steps_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = lean(build(size_config("shipped"), "cpu")).eval()
    b = {k: torch.from_numpy(v) for k, v in _inputs(model.cfg).items()}  # the sweep's own batch-1 inputs

    def call():
        with torch.no_grad():
            return model.sample([b[k] for k in model.cfg.image_keys], b["state"], b["tokens"], b["noise"])

    before = call()
    p = phase_split(call, model, "cpu")
    assert set(PHASES) <= set(p) and p["unattributed_ms"] == 0.0
    pre, steps = p["prefix"], p["steps"]
    assert pre["kernels"] > 0 and steps["kernels"] > 0 and "GEMM" in pre["categories"] and "GEMM" in steps["categories"]
    # every step region runs the same ops, and each phase's categories add up to it
    assert steps["kernels"] % model.cfg.num_steps == 0 and steps["kernels"] > pre["kernels"]
    assert all(abs(sum(p[ph]["categories"].values()) - p[ph]["ms"]) < 1e-6 for ph in PHASES)
    # the marks are gone: the same class methods, the same chunk
    assert "guided_prefix" not in model.__dict__ and "step" not in model.__dict__
    assert torch.equal(call(), before)


def test_profiling_prints_nothing_on_stderr():
    """A profile of a few replays leaves stderr alone (Kineto printed a 'USDT:' line at each profiler start and stop,
    on top of `rollcap bench`'s report); a process of its own, as Kineto reads its log level once."""
    import os
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from rollcap.rollout.bench.kernel_profile import profile_replays\n"
        "x = torch.randn(64, 64)\n"
        "profile_replays(lambda: x @ x, torch.device('cpu'), 2)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0 and "USDT" not in res.stderr and res.stderr.strip() == "", res.stderr[-2000:]
