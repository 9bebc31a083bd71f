"""The compiled CPU plans (aoti, compile): exact across calls, fresh processes and lane threads; cache placement; errors."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

import pytest
import torch

from rollcap.kernels import BufferSpec, CaptureError, capture_count, compiled
from rollcap.kernels.runner import GraphRunner
from rollcap.policies import PolicyRunner
from tests.helpers import tiny_policy

ROOT = str(pathlib.Path(__file__).resolve().parents[2])

needs_cxx = pytest.mark.skipif(compiled.cxx_compiler() is None, reason="no C++ compiler (g++) for inductor")

_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.kernels.test_compiled import block_runner, digest
r = block_runner({backend!r}, threads={threads})
print(digest(r))
print(r.state_fingerprint().get('aoti_key', ''))
"""


def block_runner(backend: str, threads: int = 1) -> GraphRunner:
    """A small transformer-like block (matmuls, layer norm, softmax, GELU: inductor fuses the reductions) on ``backend``."""
    torch.manual_seed(0)
    lin1, lin2, norm = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)
    mods = torch.nn.ModuleList([lin1, lin2, norm]).eval()

    def fn(b):
        h = norm(b["x"])
        att = torch.softmax(h @ h.transpose(-1, -2) / 32**0.5, dim=-1) @ h
        return {"y": b["x"] + lin2(torch.nn.functional.gelu(lin1(att))) + b["noise"]}

    ins = [BufferSpec("x", (1, 16, 32), torch.float32), BufferSpec("noise", (1, 16, 32), torch.float32)]
    return GraphRunner(
        fn,
        ins,
        [BufferSpec("y", (1, 16, 32), torch.float32)],
        backend=backend,
        modules=[mods],
        label="block",
        threads=threads,
    )


def _run(r: GraphRunner, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r.write({"x": torch.randn(1, 16, 32, generator=g), "noise": torch.randn(1, 16, 32, generator=g)})
    r.launch()
    return r.wait()["y"].clone()


def digest(r: GraphRunner) -> str:
    """sha256 over three replays' output bytes."""
    return hashlib.sha256(b"".join(_run(r, s).numpy().tobytes() for s in range(3))).hexdigest()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One rollcap cache for the module (so a fresh process finds the parent's compiled library)."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("rollcap-cache")
    mp.setenv("ROLLCAP_CACHE_DIR", str(path))
    yield path
    mp.undo()


@needs_cxx
@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("backend", ["aoti", "compile"])
def test_compiled_plan_is_exact_across_calls_processes_and_threads(backend, cache):
    """Same inputs give the same bytes on every replay, in a fresh process, and on a 2-thread lane; close to eager."""
    r = block_runner(backend)
    try:
        a = _run(r, 1)
        _run(r, 2)
        assert torch.equal(_run(r, 1), a)
        assert not torch.equal(_run(r, 3), a)  # the inputs reach the plan
        g = torch.Generator().manual_seed(1)
        x, noise = torch.randn(1, 16, 32, generator=g), torch.randn(1, 16, 32, generator=g)
        torch.testing.assert_close(a, r.eager({"x": x, "noise": noise})["y"], atol=1e-5, rtol=1e-5)
        before = capture_count()
        for s in range(50):
            _run(r, s)
        assert capture_count() == before
        fp = r.state_fingerprint()
        assert fp["backend"] == backend and fp["cxx"] == compiled.cxx_compiler()[1] and fp["kernel_threads"] == 1
        here = digest(r)
    finally:
        r.close()
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=ROOT, backend=backend, threads=2)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    child, key = out.stdout.split("\n")[:2]
    assert child == here
    if backend == "aoti":
        assert key == fp["aoti_key"]
        assert (cache / "aoti" / key).is_dir() and len(list((cache / "aoti" / key).glob("*.so"))) == 1
        assert not list((cache / "aoti").glob(".build-*"))  # no build left half-done
        assert (cache / "inductor").is_dir()  # inductor's own cache went under rollcap's


def test_no_compiler_is_a_clear_error(monkeypatch):
    """Without a C++ compiler, capture refuses with one line naming the compiler and the jit fallback."""
    monkeypatch.setenv("CXX", "no-such-compiler-rollcap")
    compiled.cxx_compiler.cache_clear()
    try:
        with pytest.raises(CaptureError, match="no-such-compiler-rollcap not on PATH.*backend 'jit'"):
            PolicyRunner(tiny_policy(), backend="aoti")
    finally:
        compiled.cxx_compiler.cache_clear()


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    """ROLLCAP_CACHE_DIR wins, then XDG_CACHE_HOME/rollcap, then ~/.cache/rollcap."""
    monkeypatch.setenv("ROLLCAP_CACHE_DIR", str(tmp_path / "a"))
    assert compiled.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("ROLLCAP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert compiled.cache_dir() == tmp_path / "x" / "rollcap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compiled.cache_dir() == pathlib.Path.home() / ".cache" / "rollcap"


def test_parts_refuse_a_compiled_backend_without_a_compiler(monkeypatch):
    """rollcap run --backend aoti without g++ is a one-line config error when the build probes the machine, before
    anything loads (a spec is only words: making one probes nothing)."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import probe
    from rollcap.rollout.errors import ConfigError

    monkeypatch.setenv("CXX", "no-such-compiler-rollcap")
    compiled.cxx_compiler.cache_clear()
    try:
        parts = Parts(backend="compile")
        with pytest.raises(ConfigError, match="backend: 'compile' compiles C\\+\\+ and found no compiler"):
            probe(parts)
    finally:
        compiled.cxx_compiler.cache_clear()


# -- compile-cuda: inductor's kernels captured by rollcap's CUDA graph -------------------------------------------
def test_compile_cuda_needs_a_cuda_device():
    """The compile-cuda backend on CPU buffers is refused in one line naming it."""
    with pytest.raises(ValueError, match="backend 'compile-cuda' needs buffers on a CUDA device"):
        PolicyRunner(tiny_policy(), backend="compile-cuda")


def test_compiled_for_capture_picks_regions_or_the_whole_function():
    """A module naming regions is compiled region by region (named in the facts); otherwise the function is compiled whole."""
    from rollcap.policies.fused import fuse

    model = fuse(tiny_policy())
    fn, _, facts = compiled.compiled_for_capture(lambda b: b, [model], "cuda")
    assert facts["compiled"] == "regions FusedFlowVLA.guided_prefix,FusedFlowVLA.step"
    assert "triton.cudagraphs=False" in facts["inductor_options"]  # rollcap captures; inductor must not
    whole, _, facts = compiled.compiled_for_capture(lambda b: b, [torch.nn.Linear(2, 2)], "cuda")
    assert facts["compiled"] == "whole" and whole is not None


@needs_cxx
@pytest.mark.slow(seconds=60)
def test_compiled_regions_on_cpu_are_exact_across_calls_and_leave_eager_alone(cache):
    """The compile-cuda mechanism on CPU inductor: regions compiled once, two calls give the same bytes, close to eager; outside the context the plain modules run."""
    from rollcap.policies.fused import fuse

    model = fuse(tiny_policy())
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    args = (
        [torch.randint(0, 256, (1, 32, 32, 3), dtype=torch.uint8, generator=g)],
        torch.randn(1, cfg.state_dim, generator=g),
        torch.full((1, cfg.max_tokens), 256),
        torch.randn(1, cfg.horizon, cfg.action_dim, generator=g),
    )
    fn, context, facts = compiled.compiled_for_capture(lambda a: model.sample(*a), [model], "cpu")
    with torch.no_grad():
        ref = model.sample(*args)
        with context():
            a = fn(args)
            b = fn(args)
            assert model._region("step") != model.step  # routed through the compiled region
        assert model._region("step") == model.step
        assert torch.equal(model.sample(*args), ref)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", ["plain", "fused"])
def test_compile_cuda_is_one_replay_exact_across_calls_and_close_to_eager(variant):
    """compile-cuda on a GPU: one capture, replays give the same bytes, the inputs reach the plan, close to eager; facts in the fingerprint."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from rollcap.policies.fused import fuse
    from tests.helpers import make_noise, make_obs

    model = tiny_policy() if variant == "plain" else fuse(tiny_policy())
    before = capture_count()
    r = PolicyRunner(model, device="cuda", backend="compile-cuda")
    try:
        assert capture_count() == before + 1
        obs, noise = make_obs(0), make_noise(0)
        a = r.act(obs, noise)
        assert (r.act(obs, noise) == a).all()
        assert not (r.act(make_obs(1), noise) == a).all()
        assert abs(a - r.act_eager(obs, noise)).max() < 1e-4
        fp = r.state_fingerprint()
        assert fp["backend"] == "compile-cuda" and fp["compiled"].startswith("regions")
    finally:
        r.close()
