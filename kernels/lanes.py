"""Lanes: where a graph's work runs, so policy and critic overlap.

- :class:`CpuLane`: a persistent worker thread with its own intra-op thread
  budget. Torch releases the GIL inside ops, so two lanes with one thread each
  overlap on two cores. (Measured: a model left at 2 intra-op threads slows
  about 3x once a second Python thread runs torch ops; budget per lane.)
- :class:`CudaLane`: a CUDA stream; completion is an event, never a
  device-wide synchronize.

``submit()`` returns at once with a :class:`Ticket`; ``Ticket.wait()`` blocks
and re-raises the lane's failure as :class:`LaneError`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from rollcap.kernels.errors import LaneError


class Ticket:
    """The pending result of one submitted call."""

    def __init__(self, lane_name: str):
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._lane = lane_name
        self._cuda_event = None

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def done(self) -> bool:
        if self._cuda_event is not None:
            return self._done.is_set() and self._cuda_event.query()
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise TimeoutError(f"lane {self._lane}: no result within {timeout} s")
        if self._error is not None:
            raise LaneError(f"lane {self._lane}: {type(self._error).__name__}: {self._error}") from self._error
        if self._cuda_event is not None:
            self._cuda_event.synchronize()
        return self._result


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
            try:
                ticket._finish(result=fn(*args))
            except BaseException as err:  # delivered to the waiter
                ticket._finish(error=err)

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


class CudaLane(Lane):
    """A CUDA stream. ``submit`` enqueues on the stream and records an event."""

    def __init__(self, name: str = "cuda", device: torch.device | str = "cuda"):
        self.name = name
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Ticket:
        t = Ticket(self.name)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(self.stream):
                result = fn(*args)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            t._cuda_event = ev
            t._finish(result=result)
        except BaseException as err:
            t._finish(error=err)
        return t


def make_lane(name: str, device: torch.device | str, threads: int = 1) -> Lane:
    """A lane fit for ``device``: a stream on CUDA, a worker thread on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaLane(name, device)
    return CpuLane(name, threads)
