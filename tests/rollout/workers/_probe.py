"""A built-in task that tells which torch modules its process holds: at every reset it writes them to ``modules_to``.

Registered as ``ProbePushBlock-v0`` on import, so env workers (other processes) build it from the id
``tests.rollout.workers._probe:ProbePushBlock-v0``. A reset comes after the worker launched, stepped, finished and
wrote its earlier episodes, so the file names what all of that imported.
"""

from __future__ import annotations

import json
import os
import sys

import gymnasium as gym

import rollcap.envs  # noqa: F401 - registers rollcap/PushBlock-v0

ENV_ID = "tests.rollout.workers._probe:ProbePushBlock-v0"


class ProbePushBlock(gym.Wrapper):
    """``modules_to``: the file each reset writes ``{"pid", "resets", "torch": [torch's modules in sys.modules]}`` to."""

    def __init__(self, modules_to: str, **kw):
        super().__init__(gym.make("rollcap/PushBlock-v0", **kw))
        self._to, self._resets = modules_to, 0

    def reset(self, *, seed=None, options=None):
        self._resets += 1
        torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        tmp = f"{self._to}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "resets": self._resets, "torch": torch}, f)
        os.replace(tmp, f"{self._to}.{os.getpid()}")
        return self.env.reset(seed=seed, options=options)


if "ProbePushBlock-v0" not in gym.registry:
    gym.register("ProbePushBlock-v0", entry_point=ProbePushBlock)
