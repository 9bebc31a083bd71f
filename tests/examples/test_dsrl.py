"""DSRL with SB3 SAC: the example runs end to end on a tiny budget; its unsteered side is exactly ``rollcap run``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import rollcap  # noqa: E402
from rollcap.kernels.errors import CheckpointMismatch  # noqa: E402
from rollcap.envs.scene import BLOCKS, TARGETS, make_instruction  # noqa: E402
from rollcap.rollout.config import HostConfig  # noqa: E402
from rollcap.rollout.learn.dsrl import NoiseBound, SteeringConfig, SteeringObs, frozen_episodes, task_one_hot  # noqa: E402
from rollcap.rollout.stats import mcnemar_p, paired_difference, wilson  # noqa: E402
from rollcap.rollout.errors import ConfigError  # noqa: E402
from rollcap.rollout.gym.core import instruction_tokens  # noqa: E402
from rollcap.rollout.gym.envs import NoiseSteeringEnv  # noqa: E402
from rollcap.rollout.recording import EpisodeRecorder  # noqa: E402
from tests.rollout._tiny import make_env, make_runners  # noqa: E402

pytestmark = (
    pytest.mark.slow
)  # subprocesses, Ray or trained examples: the fast tier (-m "not slow") leaves them to the full suite

ROOT = Path(__file__).resolve().parents[2]


def _example(*flags, env=None, timeout=300):
    cmd = [sys.executable, str(ROOT / "examples" / "dsrl_sac.py"), *map(str, flags)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow(seconds=24)
def test_dsrl_sac_example_smoke(tmp_path):
    """A few hundred SAC steps and 5 held-out episodes: the agent is written as safetensors + JSON, both success
    rates are printed, SB3's logger leaves no directory in the temp directory (its default makes one) and writes
    TensorBoard events where --tensorboard says, and ``--load`` of the written agent scores the same held-out episodes
    the same way."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    board = importlib.util.find_spec("tensorboard") is not None  # the rl extra's
    res = _example("--timesteps", 300, "--learning-starts", 100, "--eval-episodes", 5, "--out", tmp_path / "a",
                   *(["--tensorboard", tmp_path / "tb"] if board else []), env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert not board or list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (
        "steered (SAC, deterministic) success: " in res.stdout and "unsteered (frozen policy) success: " in res.stdout
    ), res.stdout
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "dsrl_sac.json",
        "dsrl_sac.safetensors",
        "result.json",
    ]
    # torch keeps its compile cache there (torchinductor_<user>, empty here): that one is torch's, and expected
    assert not [p for p in tmp.iterdir() if p.name.startswith("SB3")], "SB3's logger left a directory in the temp dir"
    ev = json.loads((tmp_path / "a" / "result.json").read_text())["eval"]
    assert ev["episodes"] == 5 and len(ev["steered"]) == len(ev["frozen"]) == 5 and ev["run_seed"] == 2
    agent = json.loads((tmp_path / "a" / "result.json").read_text())["agent"]  # the probe saw every steered chunk
    assert (
        agent["chunks"] >= 5
        and np.isfinite([agent["q_mean"], agent["q_p5"], agent["q_p95"]]).all()
        and 0 <= agent["saturated_fraction"] <= 1
    )
    assert f"the agent over {agent['chunks']} steered chunks: Q mean" in res.stdout
    res = _example("--load", tmp_path / "a" / "dsrl_sac.json", "--eval-episodes", 5, "--out", tmp_path / "b")
    assert res.returncode == 0, res.stderr[-3000:]
    again = json.loads((tmp_path / "b" / "result.json").read_text())
    assert again["eval"] == ev and again["agent"] == agent


def test_dsrl_sac_load_refuses_a_bad_agent_in_one_line(tmp_path):
    """--load of a damaged file, or of an agent made for other spaces, exits with one line naming the file; --out
    is not created."""
    from stable_baselines3 import SAC

    from rollcap.rollout.learn.dsrl import make_steering_env
    from rollcap.rollout.learn.sac_io import load_sac, save_sac

    other = make_steering_env(SteeringConfig(noise_bound=1.0))  # the same shapes, another noise box
    save_sac(SAC("MlpPolicy", other, device="cpu"), tmp_path / "other")
    other.close()
    env = make_steering_env(SteeringConfig())
    with pytest.raises(CheckpointMismatch, match=r"other\.json: action_low -1\.0, this env.s is -1\.5"):
        load_sac(tmp_path / "other.json", env)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "old.zip").write_bytes(b"PK")  # what the script wrote before: SB3's pickled zip is not read
    for name, why in (("missing.json", "checkpoint config not found"), ("old.zip", "an SB3 zip")):
        with pytest.raises(CheckpointMismatch, match=why):
            load_sac(tmp_path / name, env)
    env.close()
    # the script: one line naming the file, nothing written
    res = _example("--load", tmp_path / "bad.json", "--out", tmp_path / "o", timeout=120)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and "Traceback" not in res.stderr and last.startswith("--load: "), res.stderr[-2000:]
    assert str(tmp_path / "bad.json") in last and "not valid JSON" in last and not (tmp_path / "o").exists()


def test_unsteered_episodes_are_rollcap_runs_episodes(tmp_path):
    """frozen_episodes gives, action for action, the episodes rollcap.run records for the same run seed."""
    p, c = make_runners(seed=2)
    mine = EpisodeRecorder(tmp_path / "mine", formats=("npz",))
    env = NoiseSteeringEnv(make_env(), p, c, HostConfig(execute_steps=3), subscribers=(mine,))
    ends = frozen_episodes(env, run_seed=5, episodes=2)
    env.close()
    q, c2 = make_runners(seed=2)
    ref = rollcap.run(
        2,
        out=tmp_path / "ref",
        env=make_env(),
        policy=q,
        critic=c2,
        seed=5,
        execute_steps=3,
        formats=("npz",),
        progress=False,
    ).records()
    got = rollcap.load(tmp_path / "mine")
    assert [(e.seed, e.stop_reason, e.num_steps, e.num_chunks) for e in ends] == [
        (r.seed, r.stop_reason, r.num_steps, r.num_chunks) for r in ref
    ]
    for a, b in zip(got, ref):
        assert a.steps["actions"].tobytes() == b.steps["actions"].tobytes()
        assert a.chunks["noise"].tobytes() == b.chunks["noise"].tobytes()


def test_task_one_hot_reads_every_instruction():
    """Each of the 9 instructions becomes its own block + target one-hot."""
    for b in range(len(BLOCKS)):
        for t in range(len(TARGETS)):
            v = task_one_hot(instruction_tokens(make_instruction(b, t)))
            assert v.dtype == np.float32 and np.flatnonzero(v).tolist() == [b, len(BLOCKS) + t]


def test_wrappers_flatten_the_observation_and_bound_the_noise():
    """SteeringObs gives a vector inside its Box; NoiseBound narrows and clips the noise."""
    p, c = make_runners(seed=2)
    env = NoiseBound(SteeringObs(NoiseSteeringEnv(make_env(), p, c, HostConfig(max_chunks=2), value_in_obs=True)), 1.5)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (28 + 6 + 1,) and env.observation_space.contains(obs)
    assert env.action_space.high.max() == 1.5 and env.action(np.full((4, 2), 9.0)).max() == 1.5
    env.close()


def test_config_and_statistics():
    """Bad config values name their field; the Wilson interval, exact McNemar p and the paired difference's adjusted
    Wald interval (Bonett and Price) match known values, and the last has width when no episode differs (it was
    +0.0 to +0.0 at n=3)."""
    with pytest.raises(ConfigError, match="noise_bound"):
        SteeringConfig(noise_bound=5.0)
    _, lo, hi = wilson(35, 50)
    assert abs(lo - 0.5625) < 1e-3 and abs(hi - 0.8090) < 1e-3
    assert mcnemar_p(0, 0) == 1.0 and abs(mcnemar_p(1, 9) - 0.021484375) < 1e-12
    d, lo, hi = paired_difference(13, 74, 200)
    assert d == -0.305 and abs(lo + 0.3835) < 1e-3 and abs(hi + 0.2205) < 1e-3  # Wald's: -0.386, -0.224
    d, lo, hi = paired_difference(0, 0, 3)
    assert d == 0.0 and abs(lo + 0.5544) < 1e-3 and abs(hi - 0.5544) < 1e-3
    assert paired_difference(3, 0, 3)[2] == 1.0  # clipped to [-1, 1]


@pytest.mark.parametrize("flag, value", [("--target-entropy", "abc"), ("--ent-coef", "x")])
def test_a_bad_entropy_flag_is_one_line_before_any_env(flag, value, tmp_path):
    """A malformed SAC entropy flag is refused at parse time: exit 2, one line naming the flag, nothing written."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dsrl_sac.py"), flag, value, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"error: {flag}: expected a number" in res.stderr.strip().splitlines()[-1] and not (tmp_path / "o").exists()


def test_the_held_out_summary_prints_figures_as_figures():
    """dsrl.py's summary: the critic's correlation to 3 places (it printed corr 0.2988325498921635), n/a where it is
    undefined, and a paired interval with width at n=3 where no episode differs (it printed +0.0 to +0.0)."""
    from rollcap.rollout.learn.dsrl_eval import summary_lines

    k = {name: 1 for name in ("steered", "frozen", "zero_noise")}
    result = {
        "episodes": 3, **{f"{n}_success": v for n, v in k.items()}, **{f"{n}_wilson": wilson(1, 3) for n in k},
        "difference_and_95ci": paired_difference(0, 0, 3), "fixed": 0, "broken": 0, "mcnemar_p": 1.0,
        "vs_zero_noise": {"difference_and_95ci": paired_difference(0, 0, 3), "fixed": 0, "broken": 0, "mcnemar_p": 1.0},
        "critic_vs_monte_carlo": {"q_mean": 0.5, "return_mean": 0.4, "bias": 0.1, "corr": 0.2988325498921635},
    }  # fmt: skip
    lines = summary_lines(result)
    assert "(95% CI -55.4 to +55.4)" in lines[3] and lines[-1].endswith("corr 0.299)"), lines
    result["critic_vs_monte_carlo"]["corr"] = None
    assert summary_lines(result)[-1].endswith("corr n/a)")
