"""A built-in task that fails: the env of the episode with seed ``FAULT_SEED`` raises on its third step.

Registered as ``FaultyPushBlock-v0`` on import, so env workers (other processes) build it from the id
``tests.rollout.workers._faulty:FaultyPushBlock-v0``.
"""

from __future__ import annotations

import time

import gymnasium as gym

import rollcap.envs  # noqa: F401 - registers rollcap/PushBlock-v0
from rollcap.rollout.seeding import episode_seed

FAULT_SEED = episode_seed(7, 1)
ENV_ID = "tests.rollout.workers._faulty:FaultyPushBlock-v0"


class FaultyPushBlock(gym.Wrapper):
    """``step_s``: each step also sleeps this long (a slow env: a chunk long enough to be killed in)."""

    def __init__(self, step_s: float = 0.0, **kw):
        super().__init__(gym.make("rollcap/PushBlock-v0", **kw))
        self._seed, self._n, self._step_s = None, 0, step_s

    def reset(self, *, seed=None, options=None):
        self._seed, self._n = seed, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self._n += 1
        if self._seed == FAULT_SEED and self._n == 3:
            raise RuntimeError("motor driver fault")
        time.sleep(self._step_s)
        return self.env.step(action)


if "FaultyPushBlock-v0" not in gym.registry:
    gym.register("FaultyPushBlock-v0", entry_point=FaultyPushBlock)
