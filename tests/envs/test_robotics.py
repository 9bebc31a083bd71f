"""gymnasium-robotics' Fetch through ExactStateWrapper: the goal is captured, restores are exact, the probe says why not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

robotics = pytest.importorskip(
    "gymnasium_robotics", reason="gymnasium-robotics is not installed (pip install rollcap[test])"
)

import rollcap.envs.adapters as adapters  # noqa: E402
from rollcap.capsule import inspect_main, load, restore, save, snapshot  # noqa: E402
from rollcap.envs import TASK_ATTRIBUTES, ExactStateWrapper, exact_state_of, probe_exactness  # noqa: E402
from rollcap.envs.compare import canonical_bytes  # noqa: E402
from rollcap.envs.checks import check_env_exact  # noqa: E402
from rollcap.envs.robotics import fix_joint_types, joint_types_compare  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]

FETCH = ["FetchReach-v4", "FetchPush-v4"]


@pytest.fixture(scope="module", autouse=True)
def fetch_builds():
    """Register the robotics ids and apply the library's MuJoCo 4 fix, as ``rollcap.make_env`` does."""
    gym.register_envs(robotics)
    fix_joint_types()


def _wrapped(env_id: str, **kwargs) -> ExactStateWrapper:
    return ExactStateWrapper(gym.make(env_id), **kwargs)


def _actions(env: gym.Env, n: int, seed: int) -> list[np.ndarray]:
    env.action_space.seed(seed)
    return [env.action_space.sample() for _ in range(n)]


def _everything(env: gym.Env) -> bytes:
    """Every array of mjData, the env's numeric attributes, its RNG and the TimeLimit counter."""
    base = env.unwrapped
    data = {n: getattr(base.data, n) for n in dir(base.data) if isinstance(getattr(base.data, n, None), np.ndarray)}
    attrs = {k: v for k, v in vars(base).items() if isinstance(v, (np.ndarray, int, float, bool))}
    steps = [getattr(w, "_elapsed_steps", None) for w in _chain(env)]
    return canonical_bytes([data, attrs, repr(base.np_random.bit_generator.state), repr(steps)])


def _chain(env: gym.Env) -> list:
    out = [env]
    while isinstance(out[-1], gym.Wrapper):
        out.append(out[-1].env)
    return out


@pytest.mark.parametrize("env_id", FETCH)
def test_goal_is_in_the_state(env_id):
    """The issue's case: restoring seed 0's state after reset(seed=1) brings back seed 0's desired_goal."""
    env = _wrapped(env_id)
    obs, _ = env.reset(seed=0)
    state = env.get_state()
    assert env.exact_state and state["task.goal"].tolist() == obs["desired_goal"].tolist()
    other, _ = env.reset(seed=1)
    assert other["desired_goal"].tolist() != obs["desired_goal"].tolist()
    env.set_state(state)
    assert env.unwrapped.goal.tolist() == obs["desired_goal"].tolist()
    action = _actions(env, 1, seed=2)[0]
    fresh = _wrapped(env_id)
    fresh.set_state(state)  # never reset: the goal still comes from the state
    assert canonical_bytes(fresh.step(action)) == canonical_bytes(env.step(action))
    assert env.state_fingerprint()["task_attributes"] == {"goal": "ndarray"}


@pytest.mark.parametrize("env_id", FETCH)
def test_check_env_exact_fetch(env_id):
    """Restores at three points replay 100 steps byte-exactly, across the 50-step TimeLimit and its resets."""
    report = check_env_exact(lambda: _wrapped(env_id), skip_render_check=True)
    assert report.steps_compared == 300


@pytest.mark.parametrize("env_id", FETCH)
def test_probe_names_the_uncaptured_goal(env_id, monkeypatch):
    """Without its family's task attributes the adapter refuses exactness, naming desired_goal and the size."""
    monkeypatch.setattr(adapters, "task_attributes_of", lambda base, extra=(): tuple(extra))
    env = _wrapped(env_id)
    env.reset(seed=0)
    assert not env.exact_state
    assert "observation['desired_goal'] differs by up to" in env.exact_state_reason
    assert "task_attributes=" in env.exact_state_reason
    assert exact_state_of(env) is None
    fixed = _wrapped(env_id, task_attributes=("goal",))  # naming it by hand works too
    assert fixed.exact_state, fixed.exact_state_reason


def test_family_table_names_fetch_goal():
    """The goal comes from the family table (gymnasium-robotics' BaseRobotEnv), not from the env id."""
    assert TASK_ATTRIBUTES["gymnasium_robotics.envs.robot_env.BaseRobotEnv"] == ("goal",)
    assert adapters.task_attributes_of(gym.make("FetchSlide-v4").unwrapped) == ("goal",)


@pytest.mark.parametrize("env_id", FETCH)
def test_first_use_check_leaves_the_live_env_as_it_was(env_id, monkeypatch):
    """The check runs once per instance, on a copy: every mjData array, attribute, the RNG and counters stay."""
    copies = []

    def counting_clone(env):
        copies.append(env)
        return clone(env)

    clone = adapters.clone_env
    monkeypatch.setattr(adapters, "clone_env", counting_clone)
    env = _wrapped(env_id)
    env.reset(seed=4)
    for a in _actions(env, 7, seed=5):
        env.step(a)
    before = _everything(env)
    assert env.exact_state and env.exact_state_reason == ""
    env.get_state()
    assert exact_state_of(env) is env
    assert _everything(env) == before
    assert len(copies) == 1
    assert _wrapped(env_id).exact_state and len(copies) == 2  # another instance checks again


def test_state_of_never_reset_fetch_refused():
    """Before its first reset Fetch's goal is empty; get_state says to reset first."""
    env = _wrapped("FetchReach-v4")
    with pytest.raises(adapters.NoExactState, match=r"goal is float64\[0\] now and float64\[3\] after reset\(\)"):
        env.get_state()


@pytest.mark.parametrize("env_id", FETCH)
def test_probe_exactness_fetch(env_id):
    """probe_exactness: Fetch is repeatable and exact once wrapped; unwrapped it says why it is not exact."""
    wrapped = probe_exactness(_wrapped(env_id))
    assert wrapped.ok and wrapped.repeatable and wrapped.exact and wrapped.reason == ""
    bare = probe_exactness(gym.make(env_id))
    assert bare.repeatable and not bare.exact and "ExactStateWrapper" in bare.reason


def test_fetch_capsule_through_disk(tmp_path, capsys):
    """A FetchPush capsule (uint64 RNG, goal) goes to disk and back, restores, and `capsule inspect` exits 0."""
    env = _wrapped("FetchPush-v4")
    env.reset(seed=3)
    for a in _actions(env, 5, seed=4):
        env.step(a)
    cap = save(snapshot({"env": env}, "fetch", tier="host"), tmp_path / "cap")
    actions = _actions(env, 8, seed=6)
    reference = [canonical_bytes(env.step(a)) for a in actions]
    fresh = _wrapped("FetchPush-v4")
    fresh.reset(seed=11)
    restore(load(cap.path), {"env": fresh})
    assert [canonical_bytes(fresh.step(a)) for a in actions] == reference
    assert inspect_main([str(cap.path)]) == 0
    assert "FAILED" not in capsys.readouterr().out


def _errors(stderr: str) -> list[str]:
    """stderr without gymnasium-robotics' own import banner (the Adroit reward note)."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("AdroitHand")]


@pytest.mark.slow(seconds=8)
def test_cli_fetch_builds_and_says_no_shipped_policy_reads_it(tmp_path):
    """`rollcap run --env gymnasium_robotics:FetchReach-v4` (README's line) builds Fetch in a fresh process and
    refuses the shipped policy in one line naming what it cannot read (it was a 38-line AssertionError, exit 1)."""
    out = tmp_path / "r"
    res = subprocess.run(
        [
            *ROLLCAP,
            "run",
            "--env",
            "gymnasium_robotics:FetchReach-v4",
            "--episodes",
            "1",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = _errors(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert lines[0].startswith(
        "rollcap run: error: --policy: gymnasium_robotics:FetchReach-v4 does not fit the policy: "
    )
    assert "no shipped policy reads this env's observations" in lines[0] and "examples/fetch_reach.py" in lines[0]
    assert not out.exists()


@pytest.mark.slow(seconds=8)
@pytest.mark.skipif(
    joint_types_compare(),
    reason="this MuJoCo compares joint types to numpy ints: gymnasium-robotics builds Fetch unpatched",
)
def test_an_env_that_fails_to_build_is_one_line(tmp_path):
    """Without the fix, Fetch's own assert fails while it builds: one line naming the env and where, exit 2, nothing created."""
    code = (
        "import sys, rollcap.envs.robotics as r; r.fix_joint_types = lambda: False; from rollcap.rollout.cli import main; "
        f"sys.exit(main(['run', '--env', 'gymnasium_robotics:FetchPush-v4', '--episodes', '1', '--out', {str(tmp_path / 'r')!r}]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    lines = _errors(res.stderr)
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert lines[0] == (
        "rollcap run: error: --env: 'gymnasium_robotics:FetchPush-v4' failed to build: "
        "AssertionError at mujoco_utils.py:142 (set_joint_qpos)"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.slow(seconds=10)
def test_fetch_example_records_and_replays_exactly(tmp_path):
    """README's Fetch line: examples/fetch_reach.py records FetchReach with its scripted policy; both replays are exact,
    and `rollcap replay RUN --env gymnasium_robotics:FetchReach-v4 --mode env` agrees in a fresh process."""
    out = tmp_path / "fetch"
    res = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fetch_reach.py"), "--episodes", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("episode")]
    assert len(lines) == 2 and all(ln.endswith("policy replay exact, env replay exact") for ln in lines), res.stdout
    assert "'success': 2" in res.stdout, res.stdout  # the script reaches the goal
    res = subprocess.run(
        [*ROLLCAP, "replay", str(out), "--env", "gymnasium_robotics:FetchReach-v4", "--mode", "env"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0 and "2 exact" in res.stdout, res.stdout + res.stderr[-3000:]
