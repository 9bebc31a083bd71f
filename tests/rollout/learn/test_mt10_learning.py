"""The learning features on MetaWorld MT10: the critic's trainer, the hard-prefix fine-tune, RECAP's state-only
inputs and MT10 demonstrations, DSRL's task code, the RTC bench over MT10 (each at its smallest setting)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip(
    "metaworld",
    reason="metaworld is not installed (pip install scipy imageio && pip install --no-deps metaworld==3.1.1)",
)

from rollcap.envs.metaworld import ID_PREFIX, INSTRUCTIONS, MT10  # noqa: E402
from rollcap.policies import ADV_POSITIVE, load_policy  # noqa: E402
from rollcap.rollout.errors import ConfigError  # noqa: E402
from rollcap.rollout.learn.mt10 import MT10Config, collect, recap_demos  # noqa: E402

SHIPPED = "policies/weights/mt10_policy.json"


def test_mt10_demos_carry_value_targets_and_the_executed_actions():
    """Each step's value is -(steps to success) / 500 (or -1 in a failure); executed[t, 0] is the noisy action taken at t."""
    d = collect(MT10Config(demos_per_task=2, steps=40, tasks=("reach-v3",), noise=(0.3,)), log=lambda m: None)
    assert d.episode_success.tolist() == [True, True]
    ends = np.flatnonzero(np.isclose(d.value, -1 / 500))
    assert len(ends) == 2 and d.value[0] == pytest.approx(-(ends[0] + 1) / 500)
    assert np.abs(d.executed[:, 0] - d.chunks[:, 0]).max() > 0.1  # noise on the executed action, clean labels
    np.testing.assert_array_equal(d.executed[0, 1:], d.executed[1, :-1])  # windows of one path


def test_recap_demos_are_state_only_and_name_their_seeds():
    """RECAP's MT10 demonstrations: images [N, 0], all advantage-positive, seeds and rule for the manifest; split over the tasks."""
    from rollcap.rollout.learn.recap.collect import demonstrations

    got = demonstrations({ID_PREFIX + "reach-v3", ID_PREFIX + "button-press-topdown-v3"}, 3, 5, None)
    d = got.demos
    assert d.images.shape == (len(d.state), 0) and (d.adv == ADV_POSITIVE).all() and d.value.shape == (len(d.state),)
    assert len(got.seeds) == 4 and "demos_per_task=2" in got.rule and len(d.episode_success) == 4
    demos, seeds, _ = recap_demos(["reach-v3"], 1, 5)
    assert len(seeds) == 1 and demos.chunks.shape[1:] == (8, 4)
    with pytest.raises(ConfigError, match="demos=0"):
        demonstrations({"InvertedPendulum-v5"}, 1, 0)
    with pytest.raises(ConfigError, match="one family at a time"):
        demonstrations({"rollcap/PushBlock-v0", ID_PREFIX + "reach-v3"}, 1, 0)
    assert demonstrations({"InvertedPendulum-v5"}, 0, 0).demos is None


@pytest.fixture(scope="module")
def tiny_mt10_run(tmp_path_factory):
    """The shipped MT10 policy, 2 episodes of reach-v3 capped at 40 steps, recorded (npz) with a fresh state-only critic."""
    import rollcap
    from rollcap.critics import ValueCritic, save_critic
    from rollcap.rollout.learn.mt10_critic import CRITIC

    d = tmp_path_factory.mktemp("mt10")
    torch.manual_seed(0)
    save_critic(ValueCritic(CRITIC), d / "critic")
    rollcap.run(2, out=d / "run", env=ID_PREFIX + "reach-v3", env_kwargs={"render_images": False, "max_steps": 40}, policy=SHIPPED,
                critic=d / "critic.json", seed=3, formats=("npz",), progress=False)  # fmt: skip
    return d


def test_recap_stages_run_on_a_state_only_policy(tiny_mt10_run):
    """collect -> refit -> advantages -> fine-tune on MetaWorld runs of the state-only MT10 policy (images [N, 0] throughout)."""
    from rollcap.critics import load_critic
    from rollcap.rollout.learn.recap import advantage, collect, improve, value

    policy = load_policy(SHIPPED)
    got = collect.collect([tiny_mt10_run / "run"], demos=1, seed=9, policy_cfg=policy.cfg)
    steps = got.rollouts
    assert steps.images.shape == (len(steps), 0) and steps.state.shape[1] == 39 and steps.final_images.shape == (2, 0)
    assert got.demos.images.shape[1:] == (0,) and got.shown.seeds and "mt10" in got.shown.rule
    critic = load_critic(tiny_mt10_run / "critic.json")
    targets = value.value_targets(steps, value.final_values(critic, steps))
    value.refit_critic(critic, steps, targets, got.demos, n_steps=2, batch=4, lr=1e-4, seed=1)
    values = value.predict(critic, steps.images, steps.state, steps.tokens)
    labels, _ = advantage.binarise(
        steps, advantage.advantages(steps, values, value.final_values(critic, steps), targets, 4), 60
    )
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    losses = improve.fine_tune(policy, steps, labels, got.demos, n_steps=2, batch=4, lr=1e-4, seed=2)
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())


@pytest.mark.slow
def test_recap_evaluates_in_every_env_of_the_runs():
    """successes() runs every seed in every env, env by env; evaluate() adds a per-env breakdown."""
    from rollcap.rollout.learn.recap.evaluate import env_list, evaluate

    envs = [
        (ID_PREFIX + "reach-v3", {"render_images": False, "max_steps": 8}),
        (ID_PREFIX + "window-open-v3", {"render_images": False, "max_steps": 8}),
    ]
    assert env_list(envs[0]) == [envs[0]] and env_list(None)[0][0] == "rollcap/PushBlock-v0"
    policy = load_policy(SHIPPED)
    res = evaluate(policy, policy, [1, 2], (4,), envs)["4"]
    assert res["episodes"] == 4 and set(res["per_env"]) == {e for e, _ in envs} and res["fixed"] == res["broken"] == 0


def test_mt10_critic_trainer_smallest_setting(tmp_path, tiny_mt10_run):
    """Recorded runs in, a state-only critic and its report out: held-out quality and the early-stop table."""
    from rollcap.critics import load_critic
    from rollcap.rollout.learn.mt10_critic import CriticTrainConfig, main

    out = tmp_path / "critic"
    with pytest.raises(SystemExit):
        main(["--run-seed", "31337"])  # the held-out run seed is refused
    main(["--runs", str(tiny_mt10_run / "run"), "--steps", "40", "--batch", "8", "--out", str(out)])
    report = json.loads((tmp_path / "mt10_critic_report.json").read_text())
    assert report["rollouts"]["episodes"] == 2 and report["held_out"]["every"] == 5
    assert [(r["threshold"], r["patience"]) for r in report["early_stop_held_out"][:6]] == [
        (-0.8, 2),
        (-0.9, 2),
        (-0.95, 2),
        (-0.97, 2),
        (-0.99, 2),
        (-0.8, 4),
    ]
    assert (
        report["suggested_stop"] is None or report["suggested_stop"]["stopped_would_succeed"] == 0
    )  # at most 0.5% of 2 successes
    assert load_critic(tmp_path / "critic.json").cfg.image_keys == ()
    with pytest.raises(ValueError, match="--episodes"):
        CriticTrainConfig(episodes=0)


def test_prefix_labels_pin_the_executed_actions():
    """Label t keeps the executed actions t..t+d-1 and the clean chunk from d on; d is uniform in 0..max_delay."""
    from rollcap.rollout.learn.mt10_prefix import MT10PrefixConfig, prefix_labels

    chunks, executed = np.zeros((400, 8, 4), np.float32), np.ones((400, 8, 4), np.float32)
    labels, d = prefix_labels(chunks, executed, 3, seed=1)
    assert set(d.tolist()) == {0, 1, 2, 3}
    assert all(labels[i, : d[i]].min(initial=1) == 1 and labels[i, d[i] :].max(initial=0) == 0 for i in range(400))
    with pytest.raises(ValueError, match="--max-delay"):
        MT10PrefixConfig(max_delay=0)


@pytest.mark.slow
def test_mt10_prefix_smallest_run_is_a_prefix_checkpoint(tmp_path):
    """One demo per task, 40 steps: a prefix-conditioned checkpoint an RTC host samples by hard inpainting."""
    from rollcap.policies.rtc import RTCPolicyRunner
    from rollcap.rollout.learn.mt10_prefix import main

    main(["--demos-per-task", "1", "--steps", "40", "--out", str(tmp_path / "p")])
    report = json.loads((tmp_path / "mt10_prefix_report.json").read_text())
    assert sum(report["delays"]) == report["samples"] and len(report["delays"]) == 4
    model = load_policy(tmp_path / "p.json")
    assert model.cfg.prefix_conditioning and RTCPolicyRunner(model).sampler == "prefix"


def test_dsrl_task_code_for_mt10():
    """An MT10 env's agent sees its task as a one-hot over MT10; other envs get none; a foreign instruction is refused."""
    from rollcap.rollout.gym.core import instruction_tokens
    from rollcap.rollout.learn.dsrl import mt10_one_hot, task_code_for

    code = task_code_for(ID_PREFIX + "peg-insert-side-v3")
    assert code.width == 10 and code.encode(
        instruction_tokens(INSTRUCTIONS["peg-insert-side-v3"])
    ).argmax() == MT10.index("peg-insert-side-v3")
    assert task_code_for(ID_PREFIX + "assembly-v3") is None and task_code_for("rollcap/PushBlock-v0").width == 6
    with pytest.raises(ValueError, match="not an MT10"):
        mt10_one_hot(instruction_tokens("put the ring on the peg"))


def test_dsrl_steering_env_over_metaworld():
    """make_steering_env(parts=...) builds the MT10 policy steered on a MetaWorld task: state 39 + task 10, noise [8, 4]."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.learn.dsrl import SteeringConfig, make_steering_env

    env = make_steering_env(SteeringConfig(execute_steps=4, value_in_obs=False, env_reward_scale=0.0),
                            parts=Parts(env_id=ID_PREFIX + "reach-v3", env_kwargs={"render_images": False, "max_steps": 12}, policy=SHIPPED, critic="none"))  # fmt: skip
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (49,) and env.action_space.shape == (8, 4)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, info = env.step(np.zeros((8, 4), np.float32))
            total += r
            done = term or trunc
        assert total == (5.0 if info["is_success"] else 0.0)  # sparse: the success bonus alone
    finally:
        env.close()


@pytest.mark.slow
def test_bench_rtc_over_metaworld(tmp_path):
    """bench.rtc --env with the MT10 policy: success rows per mode, stall with the critic off, the graph section."""
    from rollcap.rollout.bench.rtc import env_specs, main

    assert [e for e, _ in env_specs("MT10")] == [ID_PREFIX + t for t in MT10]
    out = tmp_path / "rtc.json"
    args = ["--env", ID_PREFIX + "reach-v3", "--env-kwargs", '{"render_images": false, "max_steps": 30}', "--policy", SHIPPED, "--critic", "none",
            "--episodes", "1", "--stall-episodes", "1", "--delays", "0,1", "--modes", "naive,rtc", "--period-ms", "12.5", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert (
        set(res["success"]) == {"sync/d0", "naive/d1", "rtc/d1"}
        and set(res["stall"]) == {"sync/d0", "rtc/d1"}
        and "prefix_ms_p50" not in res["graph"]
    )


def test_the_shipped_models_follow_the_env():
    """An MT10 task gets the MT10 policy and critic by default; other envs keep the built-in task's; a named one is kept."""
    from rollcap.critics import DEFAULT_CHECKPOINT as PUSH_CRITIC, MT10_CHECKPOINT as MT10_CRITIC
    from rollcap.policies import DEFAULT_CHECKPOINT as PUSH_POLICY, MT10_CHECKPOINT as MT10_POLICY
    from rollcap.rollout.spec import Parts

    assert (Parts(env_id=ID_PREFIX + "push-v3").policy, Parts(env_id=ID_PREFIX + "push-v3").critic) == (
        MT10_POLICY,
        MT10_CRITIC,
    )
    assert (Parts(env_id=ID_PREFIX + "assembly-v3").policy, Parts().critic) == (PUSH_POLICY, PUSH_CRITIC)
    named = Parts(env_id=ID_PREFIX + "push-v3", policy="expert:0.1", critic="none")
    assert (named.policy, named.critic) == ("expert:0.1", None)


@pytest.mark.slow
def test_run_and_replay_a_metaworld_task_with_the_defaults(tmp_path):
    """rollcap run --env <MT10 task> records with the MT10 policy and critic; rollcap replay (no --policy) proves it exact."""
    import subprocess
    import sys

    kw = '{"render_images": false, "max_steps": 24}'
    run = subprocess.run([sys.executable, "-m", "rollcap.rollout.cli", "run", "--env", ID_PREFIX + "reach-v3", "--env-kwargs", kw, "--episodes", "1",
                          "--format", "npz", "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    from rollcap.rollout.recording import load_any

    rec = load_any(tmp_path / "r")[0]
    assert (
        rec.fingerprints["critic"]["config"]["state_dim"] == 39
        and rec.fingerprints["policy"]["config"]["state_dim"] == 39
    )
    rep = subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0 and "1 episode(s), 3 mode(s): 3 exact" in rep.stdout and "all exact" in rep.stdout, (
        rep.stdout + rep.stderr[-2000:]
    )
