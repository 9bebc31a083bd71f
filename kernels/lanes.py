"""Lanes: where a graph's work runs, so policy and critic overlap.

- :class:`CpuLane`: a persistent worker thread with its own intra-op thread
  budget. Torch releases the GIL inside ops, so two lanes with one thread each
  overlap on two cores. (Measured: a model left at 2 intra-op threads slows
  about 3x once a second Python thread runs torch ops; budget per lane.)
- :class:`CallerLane`: no thread of its own: the call runs inside
  ``Ticket.wait()``, in the waiting thread, with the lane's thread budget.
  For a caller with nothing to do between submit and wait (the host in
  synchronous chunking): it saves a :class:`CpuLane`'s two thread hand-offs
  while another lane still overlaps (torch drops the GIL inside ops).
- :class:`CudaLane`: a CUDA stream. ``submit`` only enqueues; completion and
  timing are CUDA events on the stream, never a stream or device-wide
  synchronize, so two lanes' work runs on the GPU at the same time.

``submit()`` returns at once with a :class:`Ticket`; ``Ticket.wait()`` blocks
and re-raises the lane's failure as :class:`LaneError`; ``Ticket.seconds`` is
then how long the work ran on its lane (queueing excluded).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from rollcap.kernels.errors import LaneError

_POLL_S = 50e-6  # how often wait(timeout) polls a CUDA event


class Ticket:
    """The pending result of one submitted call.

    ``done()`` never blocks. ``wait()`` blocks until the call, and on a CUDA
    lane the device work it enqueued, has finished; it returns the call's
    result or raises :class:`LaneError`. Single waiter.
    """

    def __init__(self, lane_name: str):
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._lane = lane_name
        self._seconds: float | None = None
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # (start, end) on a CUDA lane

    def _finish(self, result: Any = None, error: BaseException | None = None, seconds: float | None = None) -> None:
        self._result, self._error, self._seconds = result, error, seconds
        self._done.set()

    def _fail(self, err: BaseException) -> LaneError:
        return LaneError(f"lane {self._lane}: {type(err).__name__}: {err}")

    def _device_done(self) -> bool:
        try:
            return self._events is None or self._events[1].query()
        except RuntimeError as err:  # an asynchronous CUDA failure surfaces here
            raise self._fail(err) from err

    def done(self) -> bool:
        """Whether the call (and its device work) has finished; never blocks."""
        return self._done.is_set() and self._device_done()

    def settle(self) -> None:
        """Wait the work out and discard its result and its error (a call that never started is dropped)."""
        try:
            self.wait()
        except LaneError:
            pass

    def wait(self, timeout: float | None = None) -> Any:
        """Block for the result; raises ``LaneError`` (chained) if the work failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._done.wait(timeout):
            raise TimeoutError(f"lane {self._lane}: no result within {timeout} s")
        if self._events is not None:
            self._wait_device(deadline, timeout)
        if self._error is not None:
            raise self._fail(self._error) from self._error
        return self._result

    def _wait_device(self, deadline: float | None, timeout: float | None) -> None:
        """Wait on this ticket's end event: only this work, never the stream or the device."""
        end = self._events[1]
        try:
            if deadline is None:
                end.synchronize()
            else:
                while not end.query():
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"lane {self._lane}: no result within {timeout} s")
                    time.sleep(_POLL_S)
        except RuntimeError as err:  # an asynchronous CUDA failure surfaces here
            raise self._fail(err) from err

    def freeze(self) -> None:
        """Read :attr:`seconds` now if the work is done (a lane that re-records this ticket's events calls it first);
        a ticket still running keeps reading its events."""
        if self._seconds is None and self._events is not None and self.done():
            self._seconds = self.seconds

    @property
    def seconds(self) -> float:
        """How long the work ran on its lane (wall time on CPU, event time on CUDA); after wait()."""
        if self._seconds is None:
            if not self.done():
                raise LaneError(f"lane {self._lane}: seconds asked before the work finished; wait() first")
            if self._events is None:  # failed before anything was enqueued
                return 0.0
            start, end = self._events
            self._seconds = start.elapsed_time(end) / 1e3
        return self._seconds


class Lane:
    """Runs submitted calls in order, concurrently with the caller."""

    name: str

    def submit(self, fn: Callable[..., Any], *args: Any) -> Ticket:  # pragma: no cover - interface
        raise NotImplementedError

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Submit and wait."""
        return self.submit(fn, *args).wait()

    def close(self) -> None:
        """Stop accepting work; idempotent."""


def _run_into(ticket: Ticket, fn: Callable[..., Any], args: tuple) -> None:
    """Call ``fn(*args)`` and finish ``ticket`` with its result or its error, timed (queueing excluded)."""
    t0 = time.perf_counter()
    try:
        result = fn(*args)
    except BaseException as err:
        ticket._finish(error=err, seconds=time.perf_counter() - t0)
    else:
        ticket._finish(result=result, seconds=time.perf_counter() - t0)


class CpuLane(Lane):
    """A persistent worker thread with ``threads`` intra-op threads.

    Args:
        name: shown in errors.
        threads: intra-op threads for ops this lane runs (1 per lane on a
            2-core machine).
    """

    def __init__(self, name: str = "cpu", threads: int = 1):
        if threads < 1:
            raise ValueError(f"lane {name}: threads must be >= 1, got {threads}")
        self.name = name
        self.threads = threads
        self._q: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"rollcap-lane-{name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        torch.get_num_threads()  # finish torch's lazy per-thread init first ...
        torch.set_num_threads(self.threads)  # ... then set this thread's budget
        while True:
            item = self._q.get()
            if item is None:
                return
            ticket, fn, args = item
            _run_into(ticket, fn, args)  # any failure, an interrupt included, is delivered to the waiter

    def submit(self, fn: Callable[..., Any], *args: Any) -> Ticket:
        if self._closed:
            raise LaneError(f"lane {self.name}: closed")
        t = Ticket(self.name)
        self._q.put((t, fn, args))
        return t

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(None)
            self._thread.join(timeout=5)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class _CallerTicket(Ticket):
    """A call that runs when it is waited for, in the waiting thread."""

    def __init__(self, lane_name: str, fn: Callable[..., Any], args: tuple, threads: int):
        super().__init__(lane_name)
        self._call: tuple | None = (fn, args)
        self._threads = threads

    def wait(self, timeout: float | None = None) -> Any:
        """Run the call here (``timeout`` does not cut it short), then as :meth:`Ticket.wait`."""
        if self._call is not None:
            fn, args = self._call
            self._call = None
            outer = torch.get_num_threads()
            if outer != self._threads:
                torch.set_num_threads(self._threads)
            try:
                _run_into(self, fn, args)
            finally:
                if outer != self._threads:
                    torch.set_num_threads(outer)
            if self._error is not None and not isinstance(self._error, Exception):
                raise self._error  # an interrupt stays with the caller (the call is over); a failure comes back as a lane's would
        return super().wait(timeout)

    def settle(self) -> None:
        if self._call is not None:  # never ran: nothing to wait for
            self._call = None
            self._finish(seconds=0.0)
            return
        super().settle()


class CallerLane(Lane):
    """Runs each call inside ``Ticket.wait()``, in the waiting thread, with ``threads`` intra-op threads.

    ``submit`` queues nothing and returns at once; the ticket is not ``done()``
    until it has been waited for. Measured on 2 cores (shipped policy, critic
    on a :class:`CpuLane`, 6 interleaved rounds): the host's overhead per
    boundary was 0.49-0.56 ms against 0.73-0.84 ms with the policy on its own
    :class:`CpuLane`, whose thread waits for the GIL after ``submit`` and
    wakes the host after the call (BENCHMARKS.md, "Host overhead per chunk").
    """

    def __init__(self, name: str = "caller", threads: int = 1):
        if threads < 1:
            raise ValueError(f"lane {name}: threads must be >= 1, got {threads}")
        self.name = name
        self.threads = threads

    def submit(self, fn: Callable[..., Any], *args: Any) -> Ticket:
        return _CallerTicket(self.name, fn, args, self.threads)


class CudaLane(Lane):
    """A CUDA stream of its own.

    ``submit(fn)`` calls ``fn`` on the caller's thread with the lane's stream
    current, between a start and an end event (timing enabled), and returns
    once the work is *enqueued*: ``fn`` must only enqueue (a graph replay,
    kernel launches) and never synchronise with the host. The stream first
    waits on the caller's current stream, so inputs written there beforehand
    are read in order. The ticket is done when its end event is.
    """

    def __init__(self, name: str = "cuda", device: torch.device | str = "cuda"):
        self.name = name
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self._ready = torch.cuda.Event()  # re-recorded at every submit: the caller's stream up to the submit
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Ticket:
        return self.submit_with((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)), fn, *args)

    def submit_with(
        self, events: tuple[torch.cuda.Event, torch.cuda.Event], fn: Callable[..., Any], *args: Any
    ) -> Ticket:
        """:meth:`submit` timed by the caller's own ``(start, end)`` events (timing enabled), re-recorded here: the
        caller keeps at most one ticket of a pair unfinished and freezes the last one first (:meth:`Ticket.freeze`)."""
        if self._closed:
            raise LaneError(f"lane {self.name}: closed")
        t = Ticket(self.name)
        start, end = events
        result, error = None, None
        try:
            self._ready.record(torch.cuda.current_stream(self.device))
            self.stream.wait_event(self._ready)
            with torch.cuda.stream(self.stream):
                start.record(self.stream)
                try:
                    result = fn(*args)
                finally:  # even after a failure: wait() then covers what fn enqueued
                    end.record(self.stream)
                    t._events = (start, end)
        except Exception as err:  # delivered to the waiter (an interrupt stays with the caller)
            error = err
        t._finish(result=result, error=error)
        return t

    def close(self) -> None:
        self._closed = True


def make_lane(name: str, device: torch.device | str, threads: int = 1) -> Lane:
    """A lane fit for ``device``: a stream on CUDA, a worker thread on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaLane(name, device)
    return CpuLane(name, threads)
