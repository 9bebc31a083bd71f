"""A batched runner at GPU speed on any machine: the real batched runner's host work, a replay that takes a fixed time.

:class:`FixedLatencyRows` is :class:`~rollcap.rollout.bench.standin.FixedLatency`
for a runner captured at batch N: rows are written (``load_row``) and copied
(``write``) into the real runner's static inputs, but :meth:`launch` only notes
when the replay will be done and :meth:`wait` spins until then and returns the
runner's outputs as they are (the capture's), so a batched core or the env
workers pay their own work and a replay of exactly ``seconds``. Episodes run to
the env's time limit (the chunk is whatever the output buffer holds). Not for
recordings anyone replays: the fingerprint is the wrapped runner's.

:class:`Timed` wraps any runner (batch 1 or N, real or stand-in) and counts
what the host waited for it and what its lane worked (``last_latency_s`` per
replay: GPU time on CUDA), for the batch bench's round breakdown.
"""

from __future__ import annotations

import time

from rollcap.rollout.bench.standin import spin_until


class FixedLatencyRows:
    """A batched ``PolicyRunner`` / ``CriticRunner`` whose replay takes ``seconds``; everything else is the runner's."""

    def __init__(self, runner, seconds: float = 4e-3):
        self.runner, self.seconds = runner, float(seconds)
        self.batch, self.inputs, self.outputs, self.obs_spec = (
            runner.batch,
            runner.inputs,
            runner.outputs,
            runner.obs_spec,
        )
        self.last_latency_s = self.seconds
        self._ready: float | None = None
        if "actions" in runner.outputs:
            self.chunk_shape, self.execute_steps = tuple(runner.chunk_shape), int(runner.execute_steps)

    def load_row(self, row: int, obs, noise=None) -> None:
        self.runner.load_row(row, obs) if noise is None else self.runner.load_row(row, obs, noise)

    def write(self, values) -> None:
        self.runner.write(values)

    def obs_inputs(self, obs, finite: bool = True) -> dict:
        return self.runner.obs_inputs(obs, finite)

    def write_row(self, row: int, values) -> None:
        self.runner.write_row(row, values)

    def write_rows(self, rows) -> None:
        self.runner.write_rows(rows)

    def launch(self) -> None:
        self._ready = time.perf_counter() + self.seconds

    def wait(self) -> dict:
        spin_until(self._ready)
        self._ready = None
        return self.runner.outputs.tensors()

    def drain(self) -> None:
        self._ready = None

    def reset(self) -> None:
        self._ready = None

    def state_fingerprint(self) -> dict:
        return self.runner.state_fingerprint()

    def close(self) -> None:
        self.runner.close()


class Timed:
    """``runner`` with the host's waits (``wait``, or batch 1's ``result``) and the lane's replay seconds added up."""

    def __init__(self, runner):
        self.__dict__["_runner"] = runner
        self.__dict__["waited_s"] = 0.0
        self.__dict__["busy_s"] = 0.0
        self.__dict__["replays"] = 0

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.__dict__["waited_s"] += time.perf_counter() - t0
            self.__dict__["busy_s"] += self._runner.last_latency_s
            self.__dict__["replays"] += 1

    def wait(self):
        return self._timed(self._runner.wait)

    def result(self):
        return self._timed(self._runner.result)
