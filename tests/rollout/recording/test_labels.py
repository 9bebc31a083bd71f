"""DART-style labels (``labels="expert"``): the clean scripted expert's action on each recorded observation.

What needs no lerobot / minari: the relabelling itself and the exporters' refusals (before either is
imported, nothing written). The exported datasets are checked in tests/lerobot (marker ``lerobot``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import rollcap
from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.rollout.recording import load_any, synthetic_record
from rollcap.rollout.recording.labels import actions_of, check_labels, expert_actions, expert_for
from rollcap.rollout.recording.to_lerobot import export_lerobot
from rollcap.rollout.recording.to_minari import export_minari

KW = {"max_steps": 20, "render_images": False}


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Two episodes of the noisy expert (``expert:0.3``) and two of the clean one, 20 steps, no images."""
    root = tmp_path_factory.mktemp("demos")
    for name, policy in (("noisy", "expert:0.3"), ("clean", "expert")):
        rollcap.run(2, out=root / name, policy=policy, critic="none", env_kwargs=KW, seed=5, progress=False)
    return {name: sorted(load_any(root / name), key=lambda r: r.index) for name in ("noisy", "clean")}


def test_the_clean_expert_is_a_function_of_state_and_instruction(demos):
    """Fresh experts, other seeds, any step count: the same action on the same observation (its counter and RNG only drive noisy mistakes)."""
    rec = demos["noisy"][0]
    obs = [{"state": s, "instruction": rec.instruction} for s in rec.obs["state"]]
    a = ScriptedExpert(ExpertNoise())
    a.reset(0)
    along = np.stack([a.act(o) for o in obs])
    b = ScriptedExpert(ExpertNoise())
    b.reset(123)
    backwards = np.stack([b.act(o) for o in obs[::-1]])[::-1]
    fresh = np.stack([ScriptedExpert().act(o) for o in obs])
    assert np.array_equal(along, backwards) and np.array_equal(along, fresh)


def test_expert_labels_are_the_clean_expert_not_the_executed_action(demos):
    """Noisy demos: each label is the clean expert's action on that step's observation; the executed action differs wherever the noise moved it."""
    for rec in demos["noisy"]:
        labels = actions_of(rec, "expert")
        want = np.stack([ScriptedExpert().act({"state": s, "instruction": rec.instruction}) for s in rec.obs["state"]])
        assert labels.dtype == np.float32 and labels.shape == rec.steps["actions"].shape == (rec.num_steps, 2)
        assert np.array_equal(labels, want)
        executed = rec.steps["actions"]
        differs = (labels != executed).any(axis=1)
        assert differs.mean() > 0.9, differs
        assert np.all(np.abs(executed[~differs]) == 1.0)  # equal only where noise was clipped away at the action bound
        assert np.array_equal(actions_of(rec, "recorded"), executed)


def test_clean_demos_relabel_to_themselves(demos):
    """Recorded by the clean expert (`--policy expert`), the labels equal the recorded actions bit for bit."""
    for rec in demos["clean"]:
        assert np.array_equal(expert_actions(rec), rec.steps["actions"])


def test_what_the_expert_cannot_label_is_refused(demos):
    """Another env, no state, a foreign instruction, env options the expert cannot follow, unknown labels: one-line ValueErrors naming labels."""
    rec = demos["noisy"][0]
    cases = {
        "knows only the built-in task": synthetic_record(0, 1, steps=3),
        "no 'state' observation": replace(rec, obs={"pos": rec.obs["state"]}),
        "no instruction of the built-in task": replace(rec, instruction="open the drawer"),
        "env_kwargs are not the built-in task's": replace(rec, env_kwargs={"gravity": 2}),
        "custom scene": replace(rec, env_kwargs={"scene": {"block_radius": 0.1}}),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=f"^labels: .*{message}") as err:
            expert_for(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="labels: expected one of recorded, expert, got 'clean'"):
        check_labels("clean")


@pytest.mark.parametrize("to", ["lerobot", "minari"])
def test_exporters_refuse_expert_labels_for_another_env_before_importing(tmp_path, to):
    """A recording of another env with labels="expert" (or an unknown labels): refused before lerobot / minari is imported, nothing written."""
    from rollcap.rollout.recording import write_npz

    (tmp_path / "run").mkdir()
    write_npz(synthetic_record(0, 1, steps=3), tmp_path / "run" / "episode_00000.npz")
    export = (
        (lambda **kw: export_lerobot(tmp_path / "run", tmp_path / "out", **kw))
        if to == "lerobot"
        else (lambda **kw: export_minari(tmp_path / "run", "ns/d-v0", root=tmp_path / "out", **kw))
    )
    with pytest.raises(ValueError, match="^labels: the scripted expert knows only the built-in task"):
        export(labels="expert")
    with pytest.raises(ValueError, match="^labels: expected one of"):
        export(labels="clean")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_expert_policy_and_the_labels_follow_the_env_s_speed(tmp_path):
    """At a non-default ``max_speed`` `--policy expert` scales its actions as the relabeller does: a clean run relabels to itself
    (the policy used to build the default-speed expert whatever the env, so the two disagreed off the default)."""
    kw = {**KW, "max_steps": 40, "max_speed": 0.6}  # fast: the field is off its norm-1 cap near the block
    rollcap.run(2, out=tmp_path / "fast", policy="expert", critic="none", env_kwargs=kw, seed=5, progress=False)
    for rec in load_any(tmp_path / "fast"):
        default = np.stack(
            [ScriptedExpert().act({"state": s, "instruction": rec.instruction}) for s in rec.obs["state"]]
        )
        assert np.array_equal(expert_actions(rec), rec.steps["actions"])
        assert not np.array_equal(default, rec.steps["actions"])


def test_an_expert_run_off_the_default_speed_replays_exact(tmp_path):
    """Replay builds the expert from the recording's env (its kwargs), as the run did: all three modes exact."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.offline.replay import Replayer

    rollcap.run(
        2,
        out=tmp_path / "fast",
        policy="expert",
        critic="none",
        env_kwargs={**KW, "max_steps": 40, "max_speed": 0.6},
        seed=5,
        progress=False,
    )
    replayer = Replayer(Parts(policy="expert", critic=None))
    try:
        results = [
            r
            for rec in load_any(tmp_path / "fast")
            for r in replayer.check(str(tmp_path / "fast"), rec, ("policy", "env", "closed"))
        ]
    finally:
        replayer.close()
    assert len(results) == 6 and all(r.exact for r in results), [(r.mode, r.status) for r in results]
