"""CPU plans on torch's supported capture APIs: AOTInductor and ``torch.compile``.

Why: the ``jit`` plan is built on ``torch.jit.trace``, deprecated in torch
2.13. Two replacements are offered as :class:`~rollcap.kernels.graph.CapturedGraph`
backends:

- ``"aoti"``: ``torch.export`` + AOTInductor (``aoti_compile_and_package``).
  The package's shared library is run through its C ABI
  (``AOTInductorModelContainerRun``, the interface C++ deployments use) with
  ``ctypes``, which releases the GIL for the whole call, so the policy and
  critic lanes overlap. (torch's Python loader, ``aoti_load_package``, holds
  the GIL while the model runs.)
- ``"compile"``: ``torch.compile(fullgraph=True, dynamic=False)`` with
  inductor. Its fused C++ kernels are called from Python with the GIL held,
  so two lanes overlap only partly; offered for comparison.

A third, for CUDA, lives here too: ``"compile-cuda"`` (:func:`compiled_for_capture`) compiles with inductor
(Triton kernels, no CUDA graphs of inductor's own) and rollcap's CUDA graph then captures the compiled kernels
over its static buffers, so a chunk is still one graph replay and a capsule is still its buffers.

The CPU plans compile generated C++ with the host's compiler (``g++``). Inductor's
kernels are built for one intra-op thread (``cpp.threads = 1``), so results do
not depend on a lane's thread count; matrix products still run through ATen.
Compiling the shipped policy takes minutes (287 s on the busy 2-core machine,
BENCHMARKS.md); the AOTInductor library is cached by a key over the exported
graph, its weights and the toolchain, so a later process only loads it.

Caches live under :func:`cache_dir`: ``$ROLLCAP_CACHE_DIR``, else
``$XDG_CACHE_HOME/rollcap``, else ``~/.cache/rollcap``; ``aoti/<key>/`` holds
one compiled model, ``inductor/`` is inductor's own cache while rollcap
compiles (``TORCHINDUCTOR_CACHE_DIR`` wins when set).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import torch

from rollcap.kernels.errors import CaptureError

AOTI_FORMAT = 1
"""Bumped when the layout of ``aoti/<key>/`` or what the key covers changes."""


def cache_dir() -> Path:
    """Where compiled plans are kept (see the module docstring); not created here."""
    env = os.environ.get("ROLLCAP_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rollcap"


@cache
def cxx_compiler() -> tuple[str, str] | None:
    """``(path, first line of --version)`` of the C++ compiler inductor uses, or None when there is none."""
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path, (out.splitlines() or ["unknown"])[0].strip()


def require_compiler(label: str, backend: str) -> str:
    """The compiler's version line; raises :class:`CaptureError` naming the fix when there is none."""
    cxx = cxx_compiler()
    if cxx is None:
        raise CaptureError(
            f"{label}: backend {backend!r} compiles C++ and found no compiler ({os.environ.get('CXX') or 'g++'} not on PATH); install g++ or use backend 'jit'"
        )
    return cxx[1]


@contextlib.contextmanager
def _inductor_env() -> Iterator[None]:
    """Inductor's cache under :func:`cache_dir` (unless the user chose one) and one-thread kernels."""
    from torch._inductor import config

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir, temporary_cache_dir

    ctx = contextlib.nullcontext()
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # importing torch._inductor sets it to the default: not a choice
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        path = cache_dir() / "inductor"
        path.mkdir(parents=True, exist_ok=True)
        ctx = temporary_cache_dir(str(path))
    with ctx, config.patch({"cpp.threads": 1}):
        yield


def _why(err: BaseException) -> str:
    """``Type: first line of the message``: a compiler's error in one line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


# -- torch.compile ---------------------------------------------------------------
def build_compiled(module: torch.nn.Module, example: tuple[torch.Tensor, ...], label: str):
    """``torch.compile(module)`` compiled now on ``example`` (static shapes, one graph); returns the callable."""
    require_compiler(label, "compile")
    fn = torch.compile(module, backend="inductor", fullgraph=True, dynamic=False)
    try:
        with _inductor_env(), torch.no_grad():
            fn(*example)
    except Exception as err:
        raise CaptureError(f"{label}: torch.compile failed: {_why(err)}") from err
    return fn


# -- torch.compile, then rollcap's CUDA graph ("compile-cuda") ----------------------
INDUCTOR_OPTIONS = {"triton.cudagraphs": False, "freezing": True}
"""Inductor settings of the ``compile-cuda`` backend. No CUDA graphs of its own: rollcap captures the compiled
kernels in its graph over its static buffers. Freezing: the weights are constants of the compiled code (norm and
cast work on them is folded at compile time; under bf16 autocast no weight is cast per call), so the plan reads the
weights it was compiled with: change them and build a new runner."""


def region_compiler(device_type: str) -> Callable[[Callable], Callable]:
    """The compile function :meth:`CompiledRegions.compiled_regions` is given: inductor, one graph per region, static shapes.

    Compilation happens on a region's first call, which must run inside :func:`_compile_env` (it sets
    :data:`INDUCTOR_OPTIONS`; ``freezing`` given to ``torch.compile`` as an option is not applied, measured on 2.13).
    """

    def compile_region(region: Callable) -> Callable:
        return torch.compile(region, backend="inductor", fullgraph=True, dynamic=False)

    return compile_region


def compiled_for_capture(
    fn: Callable, modules: list[torch.nn.Module], device_type: str
) -> tuple[Callable, Callable[[], contextlib.AbstractContextManager], dict]:
    """``(fn', context, facts)``: what a ``compile-cuda`` graph warms and captures inside ``context()``.

    A module that names compiled regions (``REGIONS`` and a ``compiled_regions(compile)`` context, e.g. FlowVLA's
    prefix and expert step) has each region compiled once and routed through while ``context()`` is open; the
    Python between them (a sampler's Euler loop) is recorded by the capture. Compiling one expert step instead of
    the unrolled sampler keeps the compile time independent of the number of steps. Without such a module ``fn``
    is compiled whole. Compilation happens on the first call inside ``context()``; ``facts`` go in the fingerprint.
    """
    compile_region = region_compiler(device_type)
    owners = [m for m in modules if getattr(m, "REGIONS", ()) and hasattr(m, "compiled_regions")]
    facts = {"inductor_options": json_options(INDUCTOR_OPTIONS)}
    if owners:
        facts["compiled"] = "regions " + ",".join(f"{type(m).__name__}.{r}" for m in owners for r in m.REGIONS)

        @contextlib.contextmanager
        def context():
            with _compile_env(), contextlib.ExitStack() as stack:
                for m in owners:
                    stack.enter_context(m.compiled_regions(compile_region))
                yield

        return fn, context, facts
    facts["compiled"] = "whole"
    return compile_region(fn), _compile_env, facts


@contextlib.contextmanager
def _compile_env() -> Iterator[None]:
    """Inductor's environment, and dynamo set to fail rather than fall back to eager code when a region recompiles
    more often than its limit (a process that builds many models of one class, like the bench's size sweep, would
    otherwise capture uncompiled regions without a word)."""
    import torch._dynamo

    from torch._inductor import config

    with (
        _inductor_env(),
        config.patch(INDUCTOR_OPTIONS),
        torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True),
    ):
        yield


def json_options(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(options.items()))


# -- AOTInductor -----------------------------------------------------------------
def _digest_tensors(h, tensors: dict) -> None:
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if isinstance(t, torch.Tensor):
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def aoti_key(program, example: tuple[torch.Tensor, ...], compiler: str) -> str:
    """A digest of everything the compiled library depends on: graph, inputs, weights, constants, toolchain."""
    h = hashlib.sha256()
    h.update(
        f"rollcap-aoti-{AOTI_FORMAT}|torch {torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|{compiler}|threads 1\n".encode()
    )
    h.update(str(program.graph_module.code).encode())
    h.update(str(program.graph_signature).encode())
    h.update(repr([(tuple(t.shape), str(t.dtype), t.stride()) for t in example]).encode())
    _digest_tensors(h, dict(program.state_dict))
    _digest_tensors(h, {k: v for k, v in program.constants.items() if isinstance(v, torch.Tensor)})
    return h.hexdigest()[:32]


def _compile_package(program, dest: Path, label: str) -> None:
    """Compile ``program`` with AOTInductor and unpack its model library into ``dest`` (atomically)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".build-") as tmp:
        pkg = Path(tmp) / "model.pt2"
        try:
            with _inductor_env():
                torch._inductor.aoti_compile_and_package(program, package_path=str(pkg))
        except Exception as err:
            raise CaptureError(f"{label}: AOTInductor compile failed: {_why(err)}") from err
        out = Path(tmp) / "out"
        out.mkdir()
        with zipfile.ZipFile(pkg) as z:
            libs = [n for n in z.namelist() if n.endswith(".so") and "/data/aotinductor/" in n]
            if len(libs) != 1:
                raise CaptureError(f"{label}: AOTInductor package holds {len(libs)} model libraries, expected 1")
            model_dir = libs[0].rsplit("/", 1)[0] + "/"
            for n in z.namelist():
                if n.startswith(model_dir) and not n.endswith("/"):
                    (out / n[len(model_dir) :]).write_bytes(z.read(n))
        try:
            os.rename(out, dest)
        except OSError:
            if not _library(dest):  # another process finished the same key first; use theirs
                raise


def _library(path: Path) -> Path | None:
    libs = sorted(path.glob("*.so")) if path.is_dir() else []
    return libs[0] if len(libs) == 1 else None


_P = ctypes.pythonapi
_P.PyCapsule_GetPointer.restype = ctypes.c_void_p
_P.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_P.PyCapsule_New.restype = ctypes.py_object
_P.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class AotiPlan:
    """An AOTInductor model library, run through its C ABI with the GIL released.

    Args:
        library: the compiled ``.so``.
        n_inputs / n_outputs: what the graph takes and returns (checked against the library).
        label: for messages.

    ``plan(*inputs)`` returns fresh output tensors; the inputs are borrowed
    (their storage is read, never kept). One call at a time (one model in the
    container).
    """

    def __init__(self, library: Path, n_inputs: int, n_outputs: int, label: str):
        self.library = Path(library)
        self.label = label
        self._lib = ctypes.CDLL(str(self.library))  # CDLL (not PyDLL): calls release the GIL
        self._handle = ctypes.c_void_p()
        self._check(
            self._lib.AOTInductorModelContainerCreateWithDevice(
                ctypes.byref(self._handle), ctypes.c_size_t(1), b"cpu", None
            ),
            "create",
        )
        n_in, n_out = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.AOTInductorModelContainerGetNumInputs(self._handle, ctypes.byref(n_in)), "inputs")
        self._check(self._lib.AOTInductorModelContainerGetNumOutputs(self._handle, ctypes.byref(n_out)), "outputs")
        if (n_in.value, n_out.value) != (n_inputs, n_outputs):
            raise CaptureError(
                f"{label}: compiled library takes {n_in.value} inputs and returns {n_out.value}, the graph has {n_inputs} and {n_outputs}"
            )
        self._n_in, self._n_out = n_inputs, n_outputs
        self._in_t = ctypes.c_void_p * n_inputs
        self._out_t = ctypes.c_void_p * n_outputs
        run = self._lib.AOTInductorModelContainerRun
        run.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        run.restype = ctypes.c_int32
        self._run = run

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise CaptureError(
                f"{self.label}: AOTInductor {what} failed (code {rc}); see stderr for the runtime's message"
            )

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        aoti = torch._C._aoti
        handles = self._in_t(
            *[_P.PyCapsule_GetPointer(c, None) for c in aoti.unsafe_alloc_void_ptrs_from_tensors(list(inputs))]
        )
        out = self._out_t()
        rc = self._run(
            self._handle, handles, self._n_in, out, self._n_out, None, None
        )  # the run steals the input handles
        if rc != 0:
            raise RuntimeError(
                f"{self.label}: AOTInductor run failed (code {rc}); see stderr for the runtime's message"
            )
        return aoti.alloc_tensors_by_stealing_from_void_ptrs([_P.PyCapsule_New(p, None, None) for p in out])

    def close(self) -> None:
        """Free the model container (idempotent)."""
        if self._handle:
            self._lib.AOTInductorModelContainerDelete(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def build_aoti(
    module: torch.nn.Module, example: tuple[torch.Tensor, ...], n_outputs: int, label: str
) -> tuple[AotiPlan, str]:
    """Export ``module`` on ``example``, compile it (or load it from the cache); returns the plan and its key."""
    compiler = require_compiler(label, "aoti")
    try:
        with torch.no_grad():
            program = torch.export.export(module, example, strict=False)
    except Exception as err:
        raise CaptureError(f"{label}: torch.export failed: {_why(err)}") from err
    key = aoti_key(program, example, compiler)
    dest = cache_dir() / "aoti" / key
    if _library(dest) is None:
        _compile_package(program, dest, label)
    return AotiPlan(_library(dest), len(example), n_outputs, label), key
