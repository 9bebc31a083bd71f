"""An env that cannot replay exactly is named at record time: a warning, or with --require-exact a refusal, before anything is created."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

import rollcap
from rollcap.rollout.build import check_repeatable
from rollcap.rollout.errors import ConfigError, NotExactWarning


class DriftingEnv(gym.Env):
    """A real (if small) env with MetaWorld reach's defect: state that survives ``reset(seed=)``, so two seeded runs differ."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self):
        self.resets = 0
        self.pos = np.zeros(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1  # never reseeded: the next episode starts elsewhere
        self.pos = self.np_random.uniform(-1, 1, 2) + 0.01 * self.resets
        return self.pos.copy(), {}

    def step(self, action):
        self.pos = self.pos + 0.1 * np.asarray(action, np.float64)
        return self.pos.copy(), 0.0, False, False, {}


class SteadyEnv(DriftingEnv):
    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2)
        return self.pos.copy(), {}


def test_a_drifting_env_warns_and_require_exact_refuses_it():
    with pytest.warns(NotExactWarning, match="not repeatable"):
        check_repeatable(DriftingEnv())
    with pytest.raises(ConfigError) as err:
        check_repeatable(DriftingEnv(), require=True)
    assert err.value.field == "require_exact" and "not repeatable" in err.value.problem


def test_a_repeatable_env_without_exact_state_records_quietly_unless_exactness_is_required():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_repeatable(SteadyEnv())
    with pytest.raises(ConfigError, match="require_exact"):
        check_repeatable(SteadyEnv(), require=True)


def test_the_built_in_task_passes_silently_and_run_refuses_before_creating_anything(tmp_path):
    from rollcap.rollout.build import make_env

    env = make_env()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_repeatable(env, require=True)
    env.close()

    class Zero:
        chunk_shape = (4, 2)

        def reset(self):
            pass

        def start(self, obs, noise):
            pass

        def result(self):
            return np.zeros(self.chunk_shape, np.float32)

        def state_fingerprint(self):
            return {"kind": "zero"}

    with pytest.raises(ConfigError, match="require_exact"):
        rollcap.run(2, out=tmp_path / "run", env=DriftingEnv(), policy=Zero(), require_exact=True, progress=False)
    assert not (tmp_path / "run").exists()


def test_the_cli_prints_the_warning_as_one_line():
    code = (
        "import sys, warnings; sys.argv = ['rollcap']\n"
        "from rollcap.rollout.cli import _show_warning; warnings.showwarning = _show_warning\n"
        "from rollcap.rollout.errors import NotExactWarning\n"
        "warnings.warn('X-v0: not repeatable: obs differs', NotExactWarning)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stderr.strip() == "rollcap: warning: X-v0: not repeatable: obs differs"
