"""A graph runner: input buffers -> captured graph -> output buffers, on a lane.

The policy and critic runners build on this. It owns the static buffers, the
captured graph and the lane; it knows nothing of observations or episodes.
It implements the capsule ``Stateful`` protocol over *all* its buffers (inputs
and outputs): restoring them is copying bytes back into the same addresses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSet, BufferSpec
from rollcap.kernels.errors import BadInput, LaneError, ReplayInFlight
from rollcap.kernels.fingerprint import device_fingerprint
from rollcap.kernels.graph import CapturedGraph, GraphFn, default_backend
from rollcap.kernels.precision import DEFAULT_PRECISION, precision_context
from rollcap.kernels.lanes import CallerLane, CudaLane, Lane, Ticket, make_lane


@contextlib.contextmanager
def _intra_op_threads(n: int | None):
    """Run the block with ``n`` intra-op threads in this thread (None: as it is), then restore.

    Warm-up and capture run in the constructor's thread, on torch's default
    budget (every core) unless told otherwise. With another process busy on one
    of two cores, a 2-thread op spins at its barrier: the default policy's
    capture measured 13.5 s that way against 1 s at the lane's 1 thread. The
    plan's bits are the replays', which run on the lane's budget either way.
    """
    outer = torch.get_num_threads()
    if n is None or n == outer:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(outer)


class GraphRunner:
    """Static buffers + one captured graph + one lane.

    Args:
        fn: the graph function (see :class:`CapturedGraph`).
        in_specs / out_specs: the static buffers.
        device: where buffers and graph live.
        backend: one of :data:`~rollcap.kernels.graph.BACKENDS`; ``None`` picks the device default.
        modules: modules whose weights ``fn`` uses.
        lane: the lane replays run on (one is made if ``None``).
        label: a short name (``"policy"``, ``"critic"``).
        weights_digest: digest of the weights, for the fingerprint.
        precision: ``fp32`` / ``tf32`` / ``bf16`` (:mod:`~rollcap.kernels.precision`); in the fingerprint unless fp32.

    Lifecycle: the graph is captured once in the constructor; afterwards
    :meth:`write` fills the inputs, :meth:`launch` submits one replay and
    returns at once, :meth:`wait` blocks for it (or :meth:`drain` discards it).
    One launch in flight at a time: writing the inputs while the replay may
    still read them, or launching again before ``wait()``/``drain()``, raises
    :class:`ReplayInFlight`. Single caller.

    On CUDA the replay runs on the lane's stream after the caller's current
    stream (so inputs written there come first); nothing synchronises the
    stream or the device; ``wait()`` waits on the replay's end event only.
    The host side of a CUDA call allocates nothing: inputs go through the
    buffers' pinned staging block (one asynchronous copy when every input is
    written), the outputs come back into theirs by one asynchronous copy
    enqueued behind the replay, before its end event (so after ``wait()``
    :meth:`host_output` reads them with no further synchronisation), and the
    lane's events are the runner's own, re-recorded at every launch.

    :meth:`run_in_caller` moves a CPU runner's replays into the thread that
    calls ``wait()`` (a :class:`~rollcap.kernels.lanes.CallerLane`, same
    thread budget), for a caller with nothing to do between launch and wait;
    the host does this in synchronous chunking. The outputs are the same.
    """

    def __init__(  # noqa: PLR0913 - the runner's documented construction options
        self,
        fn: GraphFn,
        in_specs: list[BufferSpec],
        out_specs: list[BufferSpec],
        device: torch.device | str = "cpu",
        backend: str | None = None,
        modules: list[torch.nn.Module] | None = None,
        lane: Lane | None = None,
        label: str = "graph",
        weights_digest: str = "",
        threads: int = 1,
        precision: str = DEFAULT_PRECISION,
    ):
        self.device = torch.device(device)
        self.backend = backend or default_backend(self.device)
        self.label = label
        self.weights_digest = weights_digest
        self.inputs = BufferSet(in_specs, self.device, label=f"{label}.in")
        self.outputs = BufferSet(out_specs, self.device, label=f"{label}.out")
        self.fn = fn
        self._own_lane = lane is None
        self.lane = lane if lane is not None else make_lane(label, self.device, threads)
        self.threads = getattr(self.lane, "threads", threads)
        self.graph = CapturedGraph(
            fn, self.inputs, self.outputs, self.backend, modules, label=label, precision=precision
        )
        self.precision = self.graph.precision
        with _intra_op_threads(self.threads if self.device.type == "cpu" else None):
            self.graph.prepare()
        self._caller_lane: CallerLane | None = None
        self._replay = self._replay_only
        self._events = None
        if self.device.type == "cuda" and self.outputs.staged:
            self._replay = self._replay_and_fetch
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self._last_ticket: Ticket | None = None
        self.last_latency_s = 0.0
        self._in_flight: Ticket | None = None
        self._live: dict[str, torch.Tensor] | None = None

    # -- hot path ------------------------------------------------------------
    def _require_idle(self, doing: str) -> None:
        """Refuse to touch the buffers while the replay in flight may still use them."""
        if self._in_flight is not None and not self._in_flight.done():
            raise ReplayInFlight(f"{self.label}: {doing} while a replay is in flight; wait() or drain() first")

    def write(self, values: Mapping[str, object], finite: tuple[str, ...] | bool = ()) -> None:
        """Validate and copy inputs into the static buffers (nothing launched)."""
        self._require_idle("inputs written")
        self.inputs.write(values, finite=finite)

    def launch(self) -> Ticket:
        """Submit one replay over the current inputs; returns once it is queued on the lane."""
        if self._in_flight is not None:
            raise ReplayInFlight(f"{self.label}: launch() while a replay is in flight; wait() or drain() first")
        lane = self._caller_lane or self.lane
        if self._events is not None and isinstance(lane, CudaLane):
            if self._last_ticket is not None:
                self._last_ticket.freeze()  # its seconds read now: its events are about to be re-recorded
            self._in_flight = self._last_ticket = lane.submit_with(self._events, self._replay)
        else:
            self._in_flight = lane.submit(self._replay)
        return self._in_flight

    def _replay_only(self) -> None:
        """CPU (and CUDA without staging): the replay; ``self.graph.replay`` is looked up at every call."""
        self.graph.replay()

    def _replay_and_fetch(self) -> None:
        """CUDA: the replay, then the outputs to their pinned host twins (both on the lane's stream)."""
        self.graph.replay()
        self.outputs.fetch_async()

    def host_output(self, name: str) -> np.ndarray | None:
        """The last waited-for replay's output ``name`` in host memory (a numpy view: copy what you keep).

        CPU: the buffer itself. CUDA: its pinned twin, filled behind the replay before the end event ``wait()``
        waited on. None for a dtype numpy lacks (read the device buffer then).
        """
        return self.outputs.host(name)

    def run_in_caller(self, on: bool = True) -> None:
        """Replay in the thread that calls :meth:`wait` (``on``) or on the lane (the default).

        CPU only: on CUDA a launch is already asynchronous and this does nothing.
        """
        if self._in_flight is not None:
            raise ReplayInFlight(f"{self.label}: run_in_caller() while a replay is in flight; wait() or drain() first")
        if self.device.type != "cpu":
            return
        self._caller_lane = CallerLane(self.label, self.threads) if on else None

    @property
    def in_caller(self) -> bool:
        """Whether replays run in the waiting thread (see :meth:`run_in_caller`)."""
        return self._caller_lane is not None

    def wait(self) -> dict[str, torch.Tensor]:
        """Block for the replay in flight; returns the live output buffers.

        Sets :attr:`last_latency_s`: seconds the replay ran on its lane.
        Raises :class:`LaneError` if it failed (the runner is then idle again).
        """
        ticket = self._in_flight
        if ticket is None:
            raise BadInput(f"{self.label}: wait() without launch()")
        try:
            ticket.wait()
        except LaneError:  # it has finished, failing; an interrupted wait leaves it in flight
            self._in_flight = None
            raise
        self._in_flight = None
        self.last_latency_s = ticket.seconds
        return self.outputs.tensors()

    def drain(self) -> None:
        """Wait out a replay still in flight and discard its result and its error.

        For the host when an episode ended with an exception between
        ``launch()`` and ``wait()``; afterwards the runner is ready for the next
        write and launch. Nothing in flight: does nothing.
        """
        ticket = self._in_flight
        if ticket is None:
            return
        ticket.settle()  # the episode has failed already: this replay's error adds nothing (one never started is dropped)
        self._in_flight = None

    def eager(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reference path: ``fn`` on fresh tensors, no static buffers, no lane; on a CPU, on the lane's thread budget,
        as the replays run (a GEMM's bits follow its thread count, and the caller's may be another)."""
        for name, v in values.items():
            self.inputs.check(name, v)
        threads = self.threads if self.device.type == "cpu" else None
        with torch.no_grad(), precision_context(self.precision, self.device), _intra_op_threads(threads):
            return {
                k: v.clone()
                for k, v in self.fn({k: torch.as_tensor(v).to(self.device) for k, v in values.items()}).items()
            }

    # -- new weights, in place -----------------------------------------------
    def load_weights(self, weights: Mapping[str, torch.Tensor], digest: str | None = None) -> str:
        """Copy ``weights`` (a state dict of the one module the graph reads) into its parameters and buffers, in place.

        The captured graph reads those tensors where they are (a CPU jit plan and a CUDA graph alike), so the next
        replay computes with the new weights: nothing is recaptured, the capture count does not move. Every name,
        shape and dtype is checked before anything is copied (a wrong one is one :class:`BadInput` line and the live
        weights are untouched). ``digest`` names the new weights (default: :func:`tensor_digest` of ``weights``, as a
        checkpoint of them names them); it becomes the fingerprint's ``weights_digest``, so every episode started
        from now on names the weights it runs with. Returns it.

        Raises:
            BadInput: a name, shape or dtype that is not the module's; a backend whose plan holds its own copy of the
                weights (aoti, compile, compile-cuda); more than one module; a replay in flight (ReplayInFlight).
        """
        from rollcap.kernels.fingerprint import tensor_digest

        self._require_idle("weights loaded")
        if self._in_flight is not None:
            raise ReplayInFlight(
                f"{self.label}: weights loaded while a replay waits to be read; wait() or drain() first"
            )
        if self.backend not in ("eager", "jit", "cuda"):
            raise BadInput(
                f"{self.label}: backend {self.backend} compiled the weights into its plan; new weights need eager, jit or cuda"
            )
        if len(self.graph.modules) != 1:
            raise BadInput(f"{self.label}: the graph reads {len(self.graph.modules)} modules; load_weights needs one")
        live = self.graph.modules[0].state_dict(keep_vars=True)
        missing, extra = sorted(set(live) - set(weights)), sorted(set(weights) - set(live))
        if missing or extra:
            raise BadInput(f"{self.label}: new weights lack {missing[:3]} and have unknown {extra[:3]}")
        for name, t in live.items():
            v = weights[name]
            if (
                not isinstance(v, torch.Tensor)
                or v.shape != t.shape
                or v.dtype.is_floating_point != t.dtype.is_floating_point
            ):
                what = f"{v.dtype} {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise BadInput(
                    f"{self.label}: new weights[{name!r}] is {what}, the live one {t.dtype} {tuple(t.shape)}"
                )
        digest = digest or tensor_digest({k: v for k, v in weights.items()})
        with torch.no_grad():
            torch._foreach_copy_([live[k].data for k in live], [weights[k].detach() for k in live])
        self.weights_digest = digest
        self._fingerprint = None  # made again, with the new digest, when asked
        return digest

    # -- capsule protocol ----------------------------------------------------
    def live_state(self) -> dict[str, torch.Tensor]:
        self._require_idle("state read")
        if self._live is None:  # the buffers are never rebound, so the mapping is built once
            live = {f"in.{k}": v for k, v in self.inputs.tensors().items()}
            live.update({f"out.{k}": v for k, v in self.outputs.tensors().items()})
            self._live = live
        return dict(self._live)

    @property
    def loads_by_copy(self) -> bool:
        """True: :meth:`load_live_state` only copies each value into the tensor :meth:`live_state` gives for it.

        The capsule's ``restore`` then copies this runner's buffers itself, in
        one batch with the other such components, after its own validation
        (which reads :meth:`live_state`, so a replay in flight still refuses).
        A subclass that overrides ``load_live_state`` is not batched.
        """
        return type(self).load_live_state is GraphRunner.load_live_state

    def load_live_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Validate every value (names, shapes, dtypes), then copy all of them with one ``_foreach_copy_``.

        The common case (a capsule of this runner: tensors of the exact dtype
        and shape) is checked in one pass against the live buffers; anything
        else takes the full path, which names what is wrong.
        """
        self._require_idle("state restored")
        live = self.live_state()
        if state.keys() == live.keys():
            dst, src = [], []
            for key, buf in live.items():
                v = state[key]
                if not (isinstance(v, torch.Tensor) and v.dtype is buf.dtype and v.shape == buf.shape):
                    break
                dst.append(buf)
                src.append(v)
            else:
                torch._foreach_copy_(dst, src)  # a value on another device falls back to per-tensor copies
                return
        self._load_checked(state)

    def _load_checked(self, state: Mapping[str, torch.Tensor]) -> None:
        """The full path: per buffer set, validate everything (naming the first problem), then copy."""
        ins = {k[3:]: v for k, v in state.items() if k.startswith("in.")}
        outs = {k[4:]: v for k, v in state.items() if k.startswith("out.")}
        stray = [k for k in state if not (k.startswith("in.") or k.startswith("out."))]
        if stray:
            raise BadInput(f"{self.label}: unknown state entries {stray}")
        self._require_idle("state restored")
        self.inputs.load(ins, copy=False)  # validates every input buffer, copies nothing yet
        self.outputs.load(outs)  # validates the outputs, then copies them ...
        self.inputs.load(ins)  # ... and the (already validated) inputs

    def state_fingerprint(self) -> dict:
        """What bit-exactness of this runner's outputs depends on (computed once)."""
        cached = getattr(self, "_fingerprint", None)
        if cached is not None:
            return dict(cached)
        self._fingerprint = self._make_fingerprint()
        return dict(self._fingerprint)

    def _make_fingerprint(self) -> dict:
        fp = device_fingerprint(self.device)
        fp.update(
            {
                "component": self.label,
                "backend": self.backend,
                "weights_digest": self.weights_digest,
                "inputs": self.inputs.spec(),
                "outputs": self.outputs.spec(),
            }
        )
        if self.precision != DEFAULT_PRECISION:  # an fp32 runner's fingerprint is what it was before precision existed
            fp["precision"] = self.precision
        fp.update(self.graph.plan_facts)  # compiled plans: the compiler and kernel threads (empty for eager/jit/cuda)
        return fp

    def close(self) -> None:
        if self._own_lane:
            self.lane.close()
