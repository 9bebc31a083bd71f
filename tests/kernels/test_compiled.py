"""The compiled CPU plans (aoti, compile): exact across calls, fresh processes and lane threads; cache placement; errors."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

import pytest
import torch

from rollcap.kernels import BufferSpec, CaptureError, capture_count
from rollcap.kernels import compiled
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
    return GraphRunner(fn, ins, [BufferSpec("y", (1, 16, 32), torch.float32)], backend=backend, modules=[mods], label="block", threads=threads)


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
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT, backend=backend, threads=2)], capture_output=True, text=True, timeout=600)
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
    """rollcap run --backend aoti without g++ is a one-line config error before anything loads."""
    from rollcap.rollout.build import Parts
    from rollcap.rollout.errors import ConfigError

    monkeypatch.setenv("CXX", "no-such-compiler-rollcap")
    compiled.cxx_compiler.cache_clear()
    try:
        with pytest.raises(ConfigError, match="backend: 'compile' compiles C\\+\\+ and found no compiler"):
            Parts(backend="compile")
    finally:
        compiled.cxx_compiler.cache_clear()
