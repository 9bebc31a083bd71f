"""A built-in task that fails: the env of the episode with seed ``FAULT_SEED`` raises on its third step.

Registered as ``FaultyPushBlock-v0`` on import, so env workers (other processes) build it from the id
``tests.rollout.workers._faulty:FaultyPushBlock-v0``.

In an env worker process (never in the process that owns the graphs) it can also die for real: ``kill_seeds`` SIGKILL
the worker on their episode's third step, ``die_at_start`` as the env is made, and ``stall_seeds`` hold the worker in
the episode's reset for ``stall_s`` seconds (while its writer thread writes what finished before).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import gymnasium as gym

import rollcap.envs  # noqa: F401 - registers rollcap/PushBlock-v0
from rollcap.rollout.seeding import episode_seed

FAULT_SEED = episode_seed(7, 1)
ENV_ID = "tests.rollout.workers._faulty:FaultyPushBlock-v0"


def _in_worker() -> bool:
    return multiprocessing.current_process().name.startswith("rollcap-env-")


class FaultyPushBlock(gym.Wrapper):
    """``step_s``: each step also sleeps this long (a slow env: a chunk long enough to be killed in)."""

    def __init__(
        self,
        step_s: float = 0.0,
        kill_seeds: tuple[int, ...] = (),
        die_at_start: bool = False,
        stall_seeds: tuple[int, ...] = (),
        stall_s: float = 0.0,
        **kw,
    ):
        if die_at_start and _in_worker():
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(gym.make("rollcap/PushBlock-v0", **kw))
        self._seed, self._n, self._step_s = None, 0, step_s
        self._kill, self._stall, self._stall_s = set(kill_seeds), set(stall_seeds), stall_s

    def reset(self, *, seed=None, options=None):
        self._seed, self._n = seed, 0
        if seed in self._stall and _in_worker():
            time.sleep(self._stall_s)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self._n += 1
        if self._seed == FAULT_SEED and self._n == 3:
            raise RuntimeError("motor driver fault")
        if self._seed in self._kill and self._n == 3 and _in_worker():
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(self._step_s)
        return self.env.step(action)


@contextmanager
def watching(fn: Callable[[threading.Event], None]) -> Iterator[None]:
    """Run ``fn(done)`` on a thread of its own for the block's duration (a watcher that kills a worker at the right
    moment, which the parent's thread cannot see from between its episodes' ends); ``done`` is set when the block
    ends, and ``fn`` must return then."""
    done = threading.Event()
    thread = threading.Thread(target=fn, args=(done,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


if "FaultyPushBlock-v0" not in gym.registry:
    gym.register("FaultyPushBlock-v0", entry_point=FaultyPushBlock)
