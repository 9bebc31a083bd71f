"""The MT10 training (``python3 -m rollcap.rollout.learn.mt10``) at its smallest setting, end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip(
    "metaworld",
    reason="metaworld is not installed (pip install scipy imageio && pip install --no-deps metaworld==3.1.1)",
)

from rollcap.envs.experts import MetaWorldScript  # noqa: E402
from rollcap.envs.metaworld import make_metaworld_env  # noqa: E402
from rollcap.policies import PolicyRunner, load_policy  # noqa: E402
from rollcap.rollout.learn.mt10 import HELD_OUT_SEED, MT10Config, collect, main, run_seeds  # noqa: E402
from rollcap.rollout.seeding import episode_seed  # noqa: E402


def test_mt10_smallest_setting_writes_a_loadable_policy_that_acts_on_metaworld(tmp_path, capsys):
    """One demo per task, 40 steps: a checkpoint that loads and gives a (horizon, 4) chunk on a state-only observation."""
    out = tmp_path / "mt10_policy"
    main(["--demos-per-task", "1", "--steps", "40", "--tasks", "reach-v3,button-press-topdown-v3", "--out", str(out)])
    report = json.loads((tmp_path / "mt10_training_report.json").read_text())
    assert report["steps"] == 40 and report["samples"] == sum(v["steps"] for v in report["demos"].values()) > 0
    assert set(report["demos"]) == {"reach-v3", "button-press-topdown-v3"}
    assert (tmp_path / "mt10_policy.safetensors").stat().st_size < 5_000_000
    policy = load_policy(tmp_path / "mt10_policy.json")
    assert policy.cfg.image_keys == () and policy.cfg.action_dim == 4
    env = make_metaworld_env("push-v3", render_images=False)
    obs, _ = env.reset(seed=1)
    chunk = PolicyRunner(policy).act(obs, np.zeros((policy.cfg.horizon, 4), np.float32))
    assert chunk.shape == (policy.cfg.horizon, 4) and np.isfinite(chunk).all()


def test_mt10_labels_are_the_clean_expert_on_the_noisy_path():
    """Chunk t holds the clean expert's actions at visited steps t..t+H-1; the path is executed with noise (DART)."""
    cfg = MT10Config(demos_per_task=1, steps=40, tasks=("push-v3",), noise=(0.3,))
    d = collect(cfg, log=lambda m: None)
    env, expert = make_metaworld_env("push-v3", render_images=False), MetaWorldScript("push-v3")
    obs, _ = env.reset(seed=episode_seed(run_seeds(cfg)[0], 0))
    np.testing.assert_array_equal(d.state[0], obs["state"])
    np.testing.assert_array_equal(d.chunks[0, 0], expert.act(obs))
    obs, *_ = env.step(np.clip(d.chunks[0, 0] + 0.5, -1, 1))  # a different action: its state differs from the demo's
    assert not np.array_equal(d.state[1], obs["state"])
    np.testing.assert_array_equal(d.chunks[1, 0], expert.act({"state": d.state[1]}))
    np.testing.assert_array_equal(d.chunks[0, 1:], d.chunks[1, :-1])  # shifted by one step
    np.testing.assert_array_equal(
        d.chunks[-1, 1:], np.repeat(d.chunks[-1, :1], len(d.chunks[-1]) - 1, 0)
    )  # padded at the end


def test_mt10_refuses_the_held_out_seed_and_bad_settings():
    with pytest.raises(ValueError, match="held-out"):
        collect(MT10Config(seed=HELD_OUT_SEED - 1, demos_per_task=1, steps=40), log=None)
    with pytest.raises(ValueError, match="--steps"):
        MT10Config(steps=10)
    with pytest.raises(ValueError, match="--tasks"):
        MT10Config(tasks=("assembly-v3",))


def test_mt10_training_is_byte_identical_when_repeated(tmp_path):
    """The weights are a function of the settings: the same smallest run twice writes the same bytes."""
    from rollcap.rollout.learn.mt10 import train_mt10

    cfg = MT10Config(demos_per_task=1, steps=40, tasks=("reach-v3",))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        train_mt10(cfg, tmp_path / name / "p", log=lambda m: None)
    assert (tmp_path / "a" / "p.safetensors").read_bytes() == (tmp_path / "b" / "p.safetensors").read_bytes()
