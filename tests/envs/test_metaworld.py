"""MetaWorld v3 tasks as ``rollcap/MetaWorld-<task>``: seeded, exact, rendered, recorded and replayed by the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip(
    "metaworld",
    reason="metaworld is not installed (pip install scipy imageio && pip install --no-deps metaworld==3.1.1)",
)

import rollcap.envs as envs  # noqa: E402
from rollcap.envs.compare import canonical_bytes  # noqa: E402
from rollcap.envs.checks import check_env_exact  # noqa: E402
from rollcap.envs.metaworld import INSTRUCTIONS, MT10, TASKS  # noqa: E402


def _make(task: str = "push-v3", **kw) -> gym.Env:
    return gym.make(f"rollcap/MetaWorld-{task}", **{"render_images": False, **kw})


def _gl() -> str | None:
    """A headless GL backend that renders here (checked in a subprocess: MUJOCO_GL is read when mujoco is imported)."""
    probe = (
        "import mujoco; r = mujoco.Renderer(mujoco.MjModel.from_xml_string('<mujoco/>'), 8, 8); r.render(); r.close()"
    )
    for gl in ("egl", "osmesa"):
        if (
            subprocess.run(
                [sys.executable, "-c", probe], env={**os.environ, "MUJOCO_GL": gl}, capture_output=True
            ).returncode
            == 0
        ):
            return gl
    return None


def test_ids_cover_the_50_tasks():
    """Every v3 task is registered and has an instruction; the observation carries it."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    assert set(TASKS) == set(ALL_V3_ENVIRONMENTS) and len(TASKS) == 50
    assert all(f"rollcap/MetaWorld-{t}" in gym.registry for t in TASKS)
    env = _make()
    obs, _ = env.reset(seed=0)
    assert obs["instruction"] == INSTRUCTIONS["push-v3"] == "push the puck to the goal"
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (39,)
    assert env.observation_space.contains(obs)


def test_episode_is_a_function_of_its_seed():
    """reset(seed) picks the variation from the seed: the same in two envs, another for another seed."""
    a, b = _make(), _make()
    first = a.reset(seed=7)[0]
    b.reset(seed=3)
    assert canonical_bytes(b.reset(seed=7)[0]) == canonical_bytes(first)
    other = a.reset(seed=8)[0]
    assert not np.array_equal(other["state"][36:], first["state"][36:])  # another goal
    act = np.array([0.3, -0.2, 0.1, 0.5], np.float32)
    a.reset(seed=7)
    b.reset(seed=7)
    assert canonical_bytes(a.step(act)) == canonical_bytes(b.step(act))


def test_restore_brings_back_the_variation():
    """A state of seed 0, restored after reset(seed=1) and in a fresh env, steps like seed 0 (goal, moved bodies)."""
    env = _make("drawer-open-v3")
    env.reset(seed=0)
    state = env.get_state()
    act = np.array([0.1, 0.2, -0.1, 1.0], np.float32)
    want = canonical_bytes(env.step(act))
    env.reset(seed=1)
    env.set_state(state)
    assert canonical_bytes(env.step(act)) == want
    fresh = _make("drawer-open-v3")
    fresh.set_state(state)
    assert canonical_bytes(fresh.step(act)) == want
    assert {"task.model_body_pos", "task.model_site_pos", "task.curr_path_length", "task._prev_obs"} <= set(state)


def test_state_refuses_another_task():
    """A push state does not restore into reach (the model digest names it)."""
    push, reach = _make("push-v3"), _make("reach-v3")
    push.reset(seed=0)
    with pytest.raises(envs.StateMismatch, match="another MuJoCo model"):
        reach.set_state(push.get_state())


@pytest.mark.slow
@pytest.mark.parametrize("task", MT10)
def test_check_env_exact_mt10(task):
    """gymnasium's check_env, seeded determinism and 3 x 100 restored steps byte-exact, per MT10 task."""
    report = check_env_exact(lambda: _make(task), skip_render_check=True)
    assert report.steps_compared == 300


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("ROLLCAP_METAWORLD_ALL") != "1",
    reason="all 50 tasks take minutes (env build + restore check each); set ROLLCAP_METAWORLD_ALL=1 (the MT10 tasks run always)",
)
def test_probe_all_50_tasks_exact():
    """Every v3 task builds, is repeatable and passes the adapter's restore check."""
    bad = {t: p.reason for t in TASKS if not (p := envs.probe_exactness(_make(t))).ok}
    assert not bad


_IMAGE_CHECK = """
import gymnasium as gym, numpy as np, rollcap.envs
from rollcap.envs.checks import canonical_bytes
env = gym.make("rollcap/MetaWorld-pick-place-v3", image_size=32, cameras=("corner", "topview"))
obs, _ = env.reset(seed=2)
assert obs["image_corner"].shape == (32, 32, 3) and obs["image_corner"].std() > 0
acts = [np.array(a, np.float32) for a in np.random.default_rng(0).uniform(-1, 1, (6, 4))]
env.step(acts[0]); state = env.get_state()
want = [canonical_bytes(env.step(a)) for a in acts[1:]]
env.reset(seed=5); env.set_state(state)
assert [canonical_bytes(env.step(a)) for a in acts[1:]] == want
other = gym.make("rollcap/MetaWorld-pick-place-v3", image_size=32, cameras=("corner", "topview")); other.set_state(state)
assert [canonical_bytes(other.step(a)) for a in acts[1:]] == want
print("ok")
"""


@pytest.mark.slow
def test_images_restore_exact():
    """Rendered images (two cameras) after a restore equal the original run's, in the same and a fresh env."""
    gl = _gl()
    if gl is None:
        pytest.skip("no headless GL here (MUJOCO_GL=egl needs libegl1 + libegl-mesa0, osmesa needs libosmesa6)")
    out = subprocess.run(
        [sys.executable, "-c", _IMAGE_CHECK],
        env={**os.environ, "MUJOCO_GL": gl},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.slow
def test_cli_run_records_and_replays_exact(tmp_path):
    """rollcap run --env rollcap/MetaWorld-reach-v3 records episodes with images; a fresh rollcap replay proves all three modes exact."""
    gl = _gl()
    if gl is None:
        pytest.skip("no headless GL here (MUJOCO_GL=egl needs libegl1 + libegl-mesa0, osmesa needs libosmesa6)")
    import torch

    from rollcap.policies import FlowVLA, FlowVLAConfig
    from rollcap.policies.runner import save_policy

    cfg = FlowVLAConfig(image_keys=("image_corner",), image_size=32, patch_size=16, state_dim=39, action_dim=4, state_group=0,
                        max_tokens=64, width=32, depth=1, heads=2, num_steps=2, horizon=4, execute_steps=4)  # fmt: skip
    torch.manual_seed(0)
    ckpt = save_policy(FlowVLA(cfg).eval(), tmp_path / "mw_policy.json")
    env = {**os.environ, "MUJOCO_GL": gl}
    kwargs = json.dumps({"image_size": 32, "max_steps": 12})
    run = [sys.executable, "-m", "rollcap.rollout.cli", "run", "--env", "rollcap/MetaWorld-reach-v3", "--env-kwargs", kwargs,
           "--policy", str(ckpt), "--critic", "none", "--episodes", "2", "--out", str(tmp_path / "run")]  # fmt: skip
    rec = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert rec.returncode == 0, rec.stderr[-2000:]
    replay = [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(tmp_path / "run"), "--mode", "policy,env,closed",
              "--policy", str(ckpt), "--critic", "none"]  # fmt: skip
    out = subprocess.run(replay, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "6 exact" in out.stdout.splitlines()[-1], out.stdout


def test_success_is_reported_as_is_success():
    """info["is_success"] (what the host stops on) is MetaWorld's info["success"], and the task's expert reaches it."""
    from rollcap.envs.experts import scripted_expert

    env = _make("reach-v3")
    expert = scripted_expert(env)
    obs, _ = env.reset(seed=1)
    flags = []
    for _ in range(200):
        obs, _, terminated, truncated, info = env.step(expert.act(obs))
        assert info["is_success"] is bool(info["success"]) and not terminated
        flags.append(info["is_success"])
        if info["is_success"]:
            break
    assert flags[-1] and not any(flags[:-1]) and len(flags) > 5


def test_fingerprint_names_the_step_limit():
    """The env truncates itself after max_steps: the exact-state fingerprint says so (what branch values divide by)."""
    assert envs.exact_state_of(_make()).state_fingerprint()["step_limit"] == 500
    assert envs.exact_state_of(_make(max_steps=12)).state_fingerprint()["step_limit"] == 12


def test_expert_policy_is_the_tasks_script():
    """`expert[:STD]` on a MetaWorld env is that task's metaworld.policies class: 4-wide chunks, named in the fingerprint;
    an env id without an expert is refused naming the policy; the built-in task keeps its expert and fingerprint."""
    from rollcap.rollout.named import expert_policy
    from rollcap.rollout.errors import ConfigError

    env = _make("drawer-open-v3")
    policy = expert_policy("expert:0.1", env)
    assert policy.chunk_shape == (1, 4)
    fp = policy.state_fingerprint()
    assert (
        fp["expert"] == "metaworld.policies.sawyer_drawer_open_v3_policy.SawyerDrawerOpenV3Policy" and fp["std"] == 0.1
    )
    assert (
        expert_policy("expert", env_id="rollcap/MetaWorld-drawer-open-v3").state_fingerprint()["expert"] == fp["expert"]
    )
    obs, _ = env.reset(seed=4)
    noise = np.full((1, 4), 0.5, np.float32)
    clean = expert_policy("expert", env)
    clean.start(obs, noise)
    policy.start(obs, noise)
    a, b = clean.result(), policy.result()
    assert a.dtype == np.float32 and np.array_equal(b, np.clip(a + np.float32(0.1) * noise, -1, 1))
    with pytest.raises(ConfigError, match="expert: Pendulum-v1 has no scripted expert") as err:
        expert_policy("expert", env_id="Pendulum-v1")
    assert err.value.field == "policy"
    push_block = expert_policy("expert", env_id="rollcap/PushBlock-v0")
    assert push_block.chunk_shape == (1, 2) and set(push_block.state_fingerprint()) == {"kind", "std", "noise", "numpy"}


@pytest.mark.slow
def test_cli_expert_run_records_and_replays_exact(tmp_path):
    """rollcap run --policy expert:0.1 on push-v3 (state only) records successes; a fresh rollcap replay proves all three modes exact,
    and the clean expert is another policy (not comparable, not exact)."""
    cli = [sys.executable, "-m", "rollcap.rollout.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [*cli, "run", "--env", "rollcap/MetaWorld-push-v3", "--env-kwargs", '{"render_images": false}', "--policy", "expert:0.1",
           "--critic", "none", "--episodes", "2", "--seed", "5", "--format", "npz", "--out", str(tmp_path / "run")]  # fmt: skip
    rec = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert rec.returncode == 0, rec.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["successes"] == 2 and summary["stop_reasons"] == {"success": 2}, summary
    from rollcap.rollout.offline.branch import max_steps_of
    from rollcap.rollout.recording import load_any

    recs = load_any(tmp_path / "run")
    assert recs[0].steps["actions"].shape[1] == 4 and max_steps_of(recs[0]) == 500  # the step limit MC values divide by
    assert recs[0].fingerprints["policy"]["expert"].endswith("SawyerPushV3Policy")
    replay = [*cli, "replay", str(tmp_path / "run"), "--policy", "expert:0.1", "--critic", "none"]
    out = subprocess.run(replay, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "6 exact" in out.stdout.splitlines()[-1], out.stdout[-2000:] + out.stderr[-2000:]
    clean = subprocess.run([*cli, "replay", str(tmp_path / "run"), "--policy", "expert", "--critic", "none", "--mode", "policy"],
                           env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert clean.returncode == 1 and "2 not comparable" in clean.stdout.splitlines()[-1], clean.stdout[-2000:]


def _rollcap(*args, **env):
    """The rollcap command in a subprocess whose environment has no MUJOCO_GL (unless given) and no display."""
    base = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")}
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)]
    return subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, timeout=600)


_EXPERT_RUN = ["--env", "rollcap/MetaWorld-reach-v3", "--policy", "expert", "--critic", "none", "--episodes", 1,
               "--env-kwargs", json.dumps({"image_size": 32, "max_steps": 12}), "--no-progress"]  # fmt: skip


@pytest.mark.slow(seconds=30)
def test_images_without_mujoco_gl_choose_a_headless_backend(tmp_path):
    """No MUJOCO_GL, no display: rollcap picks EGL or OSMesa itself, records images, and replays them exact in env mode."""
    from rollcap.envs.gl import headless_backend

    if headless_backend() is None:
        pytest.skip("no EGL or OSMesa libraries here (the refusal is checked by the next test)")
    rec = _rollcap("run", *_EXPERT_RUN, "--out", tmp_path / "run")
    assert rec.returncode == 0, rec.stderr[-2000:]
    from rollcap.rollout.recording import load_any

    image = load_any(tmp_path / "run" / "episodes")[0].obs["image_corner"]
    assert image.shape[1:] == (32, 32, 3) and image.std() > 0
    out = _rollcap("replay", tmp_path / "run", "--mode", "env,closed")
    assert out.returncode == 0 and "2 exact" in out.stdout.splitlines()[-1], out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.slow(seconds=20)
def test_a_gl_backend_that_cannot_render_is_one_line_naming_mujoco_gl(tmp_path):
    """MUJOCO_GL=glfw without a display: run refuses in one line naming MUJOCO_GL (exit 2, nothing created, no abort);
    replay reports the env mode failed for that reason, never 'no exact state'."""
    res = _rollcap("run", *_EXPERT_RUN, "--out", tmp_path / "run", MUJOCO_GL="glfw")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "MUJOCO_GL" in lines[0], res.stderr[-2000:]
    assert lines[0].startswith("rollcap run: error: --env: ") and not (tmp_path / "run").exists()
    if _gl() is None:
        return
    rec = _rollcap("run", *_EXPERT_RUN, "--out", tmp_path / "ok", MUJOCO_GL=_gl())
    assert rec.returncode == 0, rec.stderr[-2000:]
    out = _rollcap("replay", tmp_path / "ok", "--mode", "env", MUJOCO_GL="glfw")
    assert out.returncode == 1 and "MUJOCO_GL" in out.stdout and "no exact state" not in out.stdout, out.stdout


_HAMMER = ["--env", "rollcap/MetaWorld-hammer-v3", "--episodes", 1, "--no-progress"]  # outside MT10


def test_a_task_outside_mt10_runs_its_expert_and_a_misfit_names_policy_expert(tmp_path, capsys):
    """`--policy expert` on hammer (not MT10) runs, with no critic (none of the shipped ones reads the task; it used to
    be refused as "does not fit the critic"); without --policy the one line names --policy and says --policy expert,
    with --env-kwargs that do not matter too (they used to be blamed)."""
    from rollcap.rollout.cli import main

    kw = json.dumps({"render_images": False, "max_steps": 12})
    assert (
        main(["run", *map(str, _HAMMER), "--policy", "expert", "--env-kwargs", kw, "--out", str(tmp_path / "x")]) == 0
    )
    from rollcap.rollout.recording import load_any

    (rec,) = load_any(tmp_path / "x")
    assert rec.fingerprints["policy"]["kind"] == "rollcap.expert" and "critic" not in rec.fingerprints
    capsys.readouterr()
    for extra in ([], ["--env-kwargs", kw]):
        assert main(["run", *map(str, _HAMMER), *extra, "--out", str(tmp_path / "y")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and not (tmp_path / "y").exists(), err
        assert err.startswith("rollcap run: error: --policy: rollcap/MetaWorld-hammer-v3 does not fit the policy: ")
        assert "--policy expert runs the task's scripted expert" in err, err


def test_the_install_line_brings_what_metaworld_imports():
    """README's MetaWorld install (rollcap's [metaworld] extra, then metaworld with --no-deps) gives metaworld every
    requirement of its own but the MuJoCo pin (scipy was missing: `import metaworld` failed), and [all] (CI) has them."""
    import importlib.metadata
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]

    def names(reqs) -> set[str]:
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in reqs}

    given = names(project["dependencies"]) | names(project["optional-dependencies"]["metaworld"])
    wanted = names(r for r in importlib.metadata.requires("metaworld") if "extra ==" not in r) - {"mujoco"}
    assert wanted <= given, wanted - given
    assert names(project["optional-dependencies"]["metaworld"]) <= names(project["optional-dependencies"]["all"])
    assert "pip install -e '.[metaworld]' && pip install --no-deps metaworld==3.1.1" in (root / "README.md").read_text()
