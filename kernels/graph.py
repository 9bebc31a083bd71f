"""Captured graphs over static buffers: warmup -> capture -> replay.

A :class:`CapturedGraph` turns a function of named input tensors into a replay
that reads the input :class:`BufferSet` and leaves its results in the output
:class:`BufferSet`. Backends:

- ``"eager"``: calls the function on every replay. Always available; the
  reference the others are compared with.
- ``"jit"`` (CPU default): a static plan captured with ``torch.jit.trace``
  over the buffers. Measured bit-identical to eager on CPU, ~20% faster for the
  default policy, and it releases the GIL while it runs so two lanes overlap.
  ``torch.jit.trace`` is deprecated in torch 2.13 (see pyproject.toml).
- ``"aoti"``: ``torch.export`` + AOTInductor, run through the library's C ABI
  with the GIL released; ``"compile"``: ``torch.compile`` (inductor, one
  graph, static shapes). Both CPU only, both need a C++ compiler; see
  :mod:`rollcap.kernels.compiled`. Exact across calls, processes and thread
  counts within the backend, not bit-equal to eager.
- ``"cuda"``: a ``torch.cuda.CUDAGraph`` captured on a side stream; replay
  re-launches the recorded kernels over the same addresses.
- ``"compile-cuda"``: the function (or the regions its modules name) compiled
  with inductor, without inductor's own CUDA graphs, then captured as ``"cuda"``
  is: one replay per call. Exact across replays; not bit-equal to eager.

A capturable function may not: keep tensors it allocates between calls, branch
on tensor *values* (``.item()``, ``if x > 0``), read Python state that changes
between replays, draw random numbers (noise comes in through a buffer), or
synchronise with the host. Shapes are fixed by the buffers.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable

import torch

from rollcap.kernels.buffers import BufferSet
from rollcap.kernels.errors import CaptureError
from rollcap.kernels.guard import guarded
from rollcap.kernels.precision import DEFAULT_PRECISION, check_plan_precision, check_precision, precision_context

BACKENDS = ("eager", "jit", "aoti", "compile", "cuda", "compile-cuda")
CPU_PLANS = ("jit", "aoti", "compile")
"""The CPU backends that capture a plan (each refuses a CUDA device)."""
CUDA_PLANS = ("cuda", "compile-cuda")
"""The backends that capture a CUDA graph (``compile-cuda``: of inductor's kernels, :mod:`rollcap.kernels.compiled`)."""

_capture_lock = threading.Lock()
_capture_total = 0


def capture_count() -> int:
    """How many graphs this process has captured (any backend but eager)."""
    return _capture_total


def _count_capture() -> None:
    global _capture_total
    with _capture_lock:
        _capture_total += 1


def check_cpu_plan(backend: str | None, device: torch.device | str) -> None:
    """ValueError (the one message of this rule) if ``backend`` is a CPU plan and ``device`` is not the CPU."""
    if backend in CPU_PLANS and torch.device(device).type != "cpu":
        raise ValueError(f"{backend!r} is a CPU plan; use 'cuda' on {device}")


def default_backend(device: torch.device | str) -> str:
    """The fastest exact backend for a device: ``cuda`` on GPU, ``jit`` on CPU."""
    return "cuda" if torch.device(device).type == "cuda" else "jit"


GraphFn = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class _Phase(enum.Enum):
    NEW = "new"
    WARM = "warm"
    CAPTURED = "captured"


class _Positional(torch.nn.Module):
    """Adapts ``fn(dict) -> dict`` to positional tensors for ``torch.jit.trace``."""

    def __init__(self, fn: GraphFn, in_names: list[str], out_names: list[str], modules: list[torch.nn.Module]):
        super().__init__()
        self.fn = fn
        self.in_names = in_names
        self.out_names = out_names
        self.mods = torch.nn.ModuleList(modules)  # registers weights as graph constants

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.fn(dict(zip(self.in_names, tensors)))
        return tuple(out[n] for n in self.out_names)


class CapturedGraph:
    """One function replayed over fixed input and output buffers.

    Args:
        fn: ``fn(inputs) -> outputs``; ``inputs`` are the live input tensors,
            ``outputs`` must match the output buffers' names, shapes and dtypes.
        inputs: static buffers the function reads.
        outputs: static buffers the results are copied into.
        backend: one of :data:`BACKENDS`.
        modules: modules whose parameters ``fn`` uses (needed by ``jit``).
        label: a short name for messages.

    Lifecycle: ``warmup()`` then ``capture()`` then any number of ``replay()``.
    ``replay()`` before ``capture()`` raises. Single-threaded: one replay at a
    time, issued from the thread (CPU) or stream (CUDA) of the caller's lane.
    """

    def __init__(
        self,
        fn: GraphFn,
        inputs: BufferSet,
        outputs: BufferSet,
        backend: str = "eager",
        modules: list[torch.nn.Module] | None = None,
        label: str = "graph",
        precision: str = DEFAULT_PRECISION,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"{label}: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if backend in CUDA_PLANS and inputs.device.type != "cuda":
            raise ValueError(f"{label}: backend {backend!r} needs buffers on a CUDA device, not {inputs.device}")
        try:
            check_cpu_plan(backend, inputs.device)
        except ValueError as err:
            raise ValueError(f"{label}: backend {err}") from None
        try:
            self.precision = check_precision(precision, inputs.device)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
        try:
            check_plan_precision(precision, backend)
        except ValueError as err:
            raise ValueError(f"{label}: precision {err}") from None
        self.fn = fn
        self.inputs = inputs
        self.outputs = outputs
        self.backend = backend
        self.modules = list(modules or [])
        self.label = label
        self._phase = _Phase.NEW
        self._plan = None
        self._cuda_graph = None
        self._static_out: list[torch.Tensor] | None = None
        self.capture_seconds = 0.0
        self.plan_facts: dict = {}
        """What the plan's bits depend on beyond the device (compiler, kernel threads); for the fingerprint."""

    @property
    def phase(self) -> str:
        return self._phase.value

    def _require(self, *phases: _Phase) -> None:
        if self._phase not in phases:
            allowed = " or ".join(p.value for p in phases)
            raise CaptureError(f"{self.label}: graph is {self._phase.value}; this needs it {allowed}")

    def _call_eager(self) -> dict[str, torch.Tensor]:
        with torch.inference_mode(False), torch.no_grad(), self._precision():
            out = self.fn(self.inputs.tensors())
        got = set(out)
        want = set(self.outputs.names)
        if got != want:
            raise CaptureError(f"{self.label}: fn returned {sorted(got)}, output buffers are {sorted(want)}")
        return out

    def _precision(self):
        """The context every call of ``fn`` runs in: eager calls, warm-up and capture (see :mod:`~rollcap.kernels.precision`)."""
        return precision_context(self.precision, self.inputs.device)

    def _copy_out(self, out: dict[str, torch.Tensor] | list[torch.Tensor]) -> None:
        names = self.outputs.names
        vals = [out[n] for n in names] if isinstance(out, dict) else list(out)
        torch._foreach_copy_([self.outputs[n] for n in names], vals)

    # -- phases --------------------------------------------------------------
    def warmup(self, iters: int = 2) -> None:
        """Run the function eagerly ``iters`` times (checks outputs; primes allocators).

        For every backend that captures, the first run is under the capture guard
        (:mod:`rollcap.kernels.guard`), on CPU as on CUDA: a hazard raises
        :class:`~rollcap.kernels.errors.CaptureHazard` naming the operation and the line.
        """
        self._require(_Phase.NEW, _Phase.WARM)
        guard = self.backend != "eager" and self._phase is _Phase.NEW  # once, before the first capture
        stream = contextlib.nullcontext()
        if self.backend == "cuda":
            side = torch.cuda.Stream(device=self.inputs.device)
            side.wait_stream(torch.cuda.current_stream(self.inputs.device))
            stream = torch.cuda.stream(side)
        with stream:
            for i in range(iters):
                self._warm_once(guard=guard and i == 0)
        if self.backend == "cuda":
            torch.cuda.current_stream(self.inputs.device).wait_stream(side)
        self._phase = _Phase.WARM

    def _warm_once(self, guard: bool) -> None:
        with guarded(self.label) if guard else contextlib.nullcontext():
            out = self._call_eager()
        self._copy_out(out)

    def capture(self) -> None:
        """Capture the plan over the current buffer addresses (counts one capture)."""
        import time

        self._require(_Phase.WARM)
        t0 = time.perf_counter()
        if self.backend == "eager":
            pass
        elif self.backend == "jit":
            self._capture_jit()
        elif self.backend in ("aoti", "compile"):
            self._capture_inductor()
        else:
            self._capture_cuda()
        self.capture_seconds = time.perf_counter() - t0
        if self.backend != "eager":
            _count_capture()
        self._phase = _Phase.CAPTURED

    def _capture_jit(self) -> None:
        in_names, out_names = self.inputs.names, self.outputs.names
        wrapper = _Positional(self.fn, in_names, out_names, self.modules).eval()
        example = tuple(self.inputs[n] for n in in_names)
        if self.precision == "bf16":
            # The plan is traced in fp32 and replays under autocast, as eager runs: a trace taken under autocast
            # records composite ops (einsum) above autocast's casts and replays them in fp32. TorchScript's own
            # autocast pass rewrites a graph run under autocast differently from eager (measured: the policy's
            # chunk differs), so it is off in a process that has a bf16 plan (it only acts on scripted code
            # with autocast blocks, which rollcap has none of).
            torch._C._jit_set_autocast_mode(False)
        with torch.no_grad():
            # The guard ran in warm-up: a host-built constant or a value read as a Python number was refused there,
            # so a TracerWarning here is news and still shows.
            try:
                plan = torch.jit.trace(wrapper, example, check_trace=False)
            except Exception as err:  # pragma: no cover - depends on fn
                raise CaptureError(f"{self.label}: jit capture failed: {err}") from err
            # The profiling executor specialises on its first runs; do them now
            # so every later replay executes the same optimised plan.
            with self._precision():
                for _ in range(3):
                    plan(*example)
        self._plan = plan
        self._plan_inputs = example

    def _capture_inductor(self) -> None:
        from rollcap.kernels import compiled

        wrapper = _Positional(self.fn, self.inputs.names, self.outputs.names, self.modules).eval()
        example = tuple(self.inputs[n] for n in self.inputs.names)
        if self.backend == "aoti":
            self._plan, key = compiled.build_aoti(wrapper, example, len(self.outputs.names), self.label)
            self.plan_facts = {"cxx": compiled.cxx_compiler()[1], "kernel_threads": 1, "aoti_key": key}
        else:
            self._plan = compiled.build_compiled(wrapper, example, self.label)
            self.plan_facts = {"cxx": compiled.cxx_compiler()[1], "kernel_threads": 1}
        self._plan_inputs = example

    def _capture_cuda(self) -> None:
        dev = self.inputs.device
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        fn, compiled_ctx = self.fn, contextlib.nullcontext
        if self.backend == "compile-cuda":  # inductor compiles on the first call; warm on the side stream, then capture
            from rollcap.kernels import compiled

            fn, compiled_ctx, self.plan_facts = compiled.compiled_for_capture(self.fn, self.modules, "cuda")
            try:
                with torch.cuda.stream(side), torch.no_grad(), self._precision(), compiled_ctx():
                    for _ in range(3):
                        self._copy_out(fn(self.inputs.tensors()))
            except Exception as err:
                raise CaptureError(
                    f"{self.label}: torch.compile failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                ) from err
        with torch.cuda.stream(side), torch.no_grad(), compiled_ctx():
            with torch.cuda.graph(g, stream=side), self._precision():
                out = fn(self.inputs.tensors())
                self._copy_out(out)
        torch.cuda.current_stream(dev).wait_stream(side)
        self._cuda_graph = g

    def replay(self) -> None:
        """Run the captured plan; results land in the output buffers."""
        self._require(_Phase.CAPTURED)
        if self.backend in CUDA_PLANS:
            self._cuda_graph.replay()
        elif self.backend in CPU_PLANS:
            with torch.no_grad(), self._precision():  # aoti / compile: fp32 only, no context
                self._copy_out(self._plan(*self._plan_inputs))
        else:
            self._copy_out(self._call_eager())

    def prepare(self, warmup_iters: int = 2) -> CapturedGraph:
        """``warmup()`` then ``capture()``; returns self."""
        self.warmup(warmup_iters)
        self.capture()
        return self
