"""A policy and critic at GPU speed on any machine: the real runners' host work, a chunk that takes a fixed time.

The host's own Python per boundary is what matters once the policy is fast
(a captured graph on a GPU replays a chunk in about 2 ms). On CPU the shipped
policy takes 8-15 ms, which hides the host. :class:`FixedLatency` wraps a
real runner (``PolicyRunner`` / ``CriticRunner``) and keeps everything it does
on the host's thread (validating the observation, writing the static input
buffers, copying the output out), but instead of replaying the graph on a
lane its result is ready ``seconds`` after :meth:`FixedLatency.start`, the way
a launched CUDA graph completes while the host goes on: the policy and the
critic "run" concurrently, and :meth:`FixedLatency.result` waits only for
what is left. The chunk is whatever the output buffer holds (the capture's
output), so episodes run to the env's time limit; that is fine for timing.

Not for recordings anyone replays: the fingerprint is the wrapped runner's.
"""

from __future__ import annotations

import time

import numpy as np

_SPIN_S = 2e-4


def spin_until(t: float) -> None:
    """Return at ``time.perf_counter()`` ``t``: asleep until the last ``_SPIN_S``, then spinning (a sleep alone wakes
    late by more than a short replay lasts)."""
    left = t - time.perf_counter()
    if left > _SPIN_S:
        time.sleep(left - _SPIN_S)
    while time.perf_counter() < t:
        pass


"""The last part of the wait is spun, not slept: ``time.sleep`` overshoots by 50-100 us, which would count as host time."""


class FixedLatency:
    """A runner whose chunk (or value) is ready ``seconds`` after :meth:`start`; its host-side work is the runner's own.

    Args:
        runner: a ``PolicyRunner`` (``load(obs, noise)``, output ``actions``) or
            ``CriticRunner`` (``load(obs)``, output ``value``).
        seconds: the lane time of one chunk (2 ms: a GPU's).

    Single caller, as the runner. ``last_latency_s`` is ``seconds`` (the lane's time).
    """

    def __init__(self, runner, seconds: float = 2e-3):
        self.runner, self.seconds = runner, float(seconds)
        self.last_latency_s = self.seconds
        self._ready: float | None = None
        self._critic = "value" in runner.outputs
        if not self._critic:
            self.chunk_shape = tuple(runner.chunk_shape)
            self.execute_steps = int(runner.execute_steps)

    def reset(self) -> None:
        """Called at episode start: nothing is in flight (the runner's own reset drains its lane)."""
        self._ready = None
        self.runner.reset()

    def start(self, obs, noise: np.ndarray | None = None) -> None:
        """The runner's validation and input writes; the chunk is ready ``seconds`` from now."""
        if self._critic:
            self.runner.load(obs)
        else:
            self.runner.load(obs, noise)
        self._ready = time.perf_counter() + self.seconds

    def result(self):
        """Wait until the chunk is ready, then copy it out as the runner does."""
        if self._ready is None:
            raise RuntimeError("result() without start()")
        spin_until(self._ready)
        self._ready = None
        return self.runner.row_result(
            0
        )  # the copy-out PolicyRunner.result / CriticRunner.result make (on a GPU: to the host)

    def state_fingerprint(self) -> dict:
        return self.runner.state_fingerprint()

    # the capsule protocol: the runner's buffers
    def live_state(self):
        return self.runner.live_state()

    def load_live_state(self, state) -> None:
        self.runner.load_live_state(state)

    def close(self) -> None:
        self.runner.close()
