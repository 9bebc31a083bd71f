"""RECAP (rollcap recap): each stage on tiny data, and the whole iteration end to end on a tiny budget."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from rollcap.kernels.fingerprint import tensor_digest
from rollcap.policies import ADV_NEGATIVE, ADV_POSITIVE, FlowVLA
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.learn.recap import RecapConfig, advantage, collect, evaluate, improve, value
from rollcap.rollout.learn.recap.collect import Steps
from rollcap.rollout.seeding import episode_seed
from tests.rollout._tiny import CRITIC, ENV_KW, POLICY

M = 10  # max_steps of the synthetic episodes


def synthetic(rows: list[dict]) -> Steps:
    """Steps of hand-made episodes: each row gives steps, success, censored (and optionally humans at given t)."""
    eps, ts, human = [], [], []
    for e, r in enumerate(rows):
        eps += [e] * r["steps"]
        ts += list(range(r["steps"]))
        human += [t in r.get("human", ()) for t in range(r["steps"])]
        r.setdefault("task", "rollcap/PushBlock-v0")
        r.setdefault("max_steps", M)
        r.setdefault("branch_of", None)
    n = len(ts)
    return Steps(
        images=np.zeros((n, 32, 32, 3), np.uint8), state=np.zeros((n, 28), np.float32), tokens=np.zeros((n, 48), np.int64),
        chunks=np.zeros((n, 4, 2), np.float32), episode=np.array(eps, np.int64), t=np.array(ts, np.int64),
        human=np.array(human, bool), label_ok=np.ones(n, bool), episodes=rows,
    )  # fmt: skip


# ------------------------------------------------------------------ collect
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ckpt):
    """A tiny recorded run: 2 episodes stopped at chunk 3 (censored: timeout_chunks), recorded as npz."""
    import rollcap

    out = tmp_path_factory.mktemp("recap") / "run"
    policy, critic = ckpt[1], ckpt[3]
    rollcap.run(
        2,
        out=out,
        policy=policy,
        critic=critic,
        env_kwargs=ENV_KW,
        max_chunks=3,
        progress=False,
        formats=("npz",),
        seed=5,
    )
    return out


def test_collect_reads_every_step_of_a_run(tiny_run):
    """read_runs: one row per step, the executed actions as chunk labels, censored episodes flagged, the run's digests kept."""
    from rollcap.rollout.recording import load_any

    recs = load_any(tiny_run)
    steps, runs = collect.read_runs([tiny_run], horizon=4, image_key="image_front", max_tokens=48)
    assert len(steps) == sum(r.num_steps for r in recs) == 2 * 3 * 4
    e0 = steps.episode == 0
    np.testing.assert_array_equal(steps.chunks[e0][0], recs[0].steps["actions"][:4])
    np.testing.assert_array_equal(steps.chunks[e0][5][:4], recs[0].steps["actions"][5:9])
    np.testing.assert_array_equal(steps.images[e0], recs[0].obs["image_front"])
    assert steps.final_images.shape == (2, 32, 32, 3)
    assert [r["stop_reason"] for r in steps.episodes] == ["timeout_chunks"] * 2
    assert all(r["censored"] and not r["success"] for r in steps.episodes)
    assert not steps.label_ok[e0][-3:].any() and steps.label_ok[e0][:-3].all()  # unknown actions past a failed end
    b = np.flatnonzero(
        steps.boundary[e0]
    )  # chunk boundaries: the chunk run from there, executed part as the env got it
    np.testing.assert_array_equal(b, recs[0].chunks["chunk_start"][:3])
    np.testing.assert_array_equal(steps.plan[e0][b[1]], recs[0].steps["actions"][4:8])
    np.testing.assert_array_equal(steps.plan[e0][b[2]], recs[0].chunks["policy_chunk"][2])
    assert (
        runs[0]["episodes"] == 2
        and runs[0]["made_with"][0]["policy"] == recs[0].fingerprints["policy"]["weights_digest"]
    )
    from rollcap.rollout.recording.codec import episode_digest

    assert runs[0]["episodes_digest"] == collect._episodes_digest([episode_digest(r) for r in recs])
    assert collect.collected_seeds(steps) == {episode_seed(5, 0), episode_seed(5, 1)}


def test_collect_keeps_critic_stopped_episodes_as_censored(tmp_path, ckpt):
    """An episode the critic stopped at its first boundary is censored, has no steps, and breaks no stage."""
    import rollcap

    rollcap.run(
        1,
        out=tmp_path / "r",
        policy=ckpt[1],
        critic=ckpt[3],
        env_kwargs=ENV_KW,
        critic_threshold=0.0,
        critic_patience=1,
        progress=False,
        formats=("npz",),
    )
    steps, _ = collect.read_runs([tmp_path / "r"], horizon=4)
    assert len(steps) == 0 and steps.episodes[0]["stop_reason"] == "critic" and steps.episodes[0]["censored"]
    assert value.value_targets(steps, np.zeros(1, np.float32)).shape == (0,)
    assert steps.final_images.shape == (1, 32, 32, 3)  # the observation the critic stopped on


def test_collect_refuses_an_empty_run(tmp_path):
    """A directory without episodes is named in the error."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        collect.read_runs([tmp_path / "empty"])


# -------------------------------------------------------------------- value
def test_value_targets_success_failure_and_censored():
    """Success: -(T-t)/max_steps; natural failure: -1; censored: bootstrapped from the critic at the stop."""
    s = synthetic(
        [
            {"steps": 3, "success": True, "censored": False},
            {"steps": 2, "success": False, "censored": False},
            {"steps": 2, "success": False, "censored": True},
        ]
    )
    v_final = np.array([0.0, -1.0, -0.3], np.float32)
    got = value.value_targets(s, v_final)
    np.testing.assert_allclose(got, [-0.3, -0.2, -0.1, -1, -1, -0.5, -0.4], atol=1e-6)


@pytest.mark.slow
def test_refit_critic_is_deterministic_and_learns(tiny_run):
    """Two refits with one seed give the same weights; the refit moves the held-in loss down from the start."""
    from rollcap.critics import ValueCritic

    steps, _ = collect.read_runs([tiny_run], horizon=4)
    targets = np.linspace(-1, 0, len(steps)).astype(np.float32)
    digests, losses = [], None
    for _ in range(2):
        torch.manual_seed(0)
        c = ValueCritic(CRITIC)
        losses = value.refit_critic(c, steps, targets, None, n_steps=8, batch=8, lr=3e-3, seed=3)
        digests.append(tensor_digest(c.state_dict()))
    assert digests[0] == digests[1]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    v = value.predict(c, steps.images, steps.state, steps.tokens)
    q = value.critic_quality(v, targets, steps, value.holdout_mask(steps))
    assert q["steps"] == int(value.holdout_mask(steps).sum()) > 0 and q["mae"] >= 0


def test_branch_calibration_groups_branches_by_boundary():
    """Branch episodes of one boundary give one Monte-Carlo point; none without branches."""
    from rollcap.critics import ValueCritic

    origin = {"parent": "p", "episode": 0, "chunk": 2}
    rows = [
        {"steps": 2, "success": True, "censored": False, "branch_of": origin},
        {"steps": 3, "success": False, "censored": False, "branch_of": origin},
    ]
    s = synthetic(rows)
    c = ValueCritic(CRITIC).eval()
    rep = value.branch_calibration({"refit": c}, s)
    assert rep["boundaries"] == 1 and rep["branches"] == 2
    expect = value.predict(c, s.images[:1], s.state[:1], s.tokens[:1])[0] - (-0.2 - 1.0) / 2
    assert rep["refit"]["mean_error"] == pytest.approx(expect, abs=1e-6)
    assert value.branch_calibration({"refit": c}, synthetic([{"steps": 2, "success": True, "censored": False}])) is None


# ---------------------------------------------------------------- advantage
def test_n_step_advantage_and_monte_carlo_tail():
    """A_t = -N/max_steps + V(t+N) - V(t) inside the episode, G_t - V(t) within N steps of its end."""
    s = synthetic([{"steps": 4, "success": True, "censored": False}])
    v = np.array([-0.5, -0.2, -0.3, -0.1], np.float32)
    g = value.value_targets(s, np.zeros(1, np.float32))
    a = advantage.advantages(s, v, np.zeros(1, np.float32), g, n=2)
    np.testing.assert_allclose(a, [-0.2 + -0.3 + 0.5, -0.2 + -0.1 + 0.2, -0.2 + 0.3, -0.1 + 0.1], atol=1e-6)


def test_binarise_at_the_percentile_with_interventions_positive():
    """The top (100 - p)% of a task's advantages are positive; a person's steps always are."""
    s = synthetic([{"steps": 10, "success": True, "censored": False, "human": (0,)}])
    adv = np.arange(10, dtype=np.float32)
    labels, stats = advantage.binarise(s, adv, 70.0)
    assert labels.tolist() == [ADV_POSITIVE] + [ADV_NEGATIVE] * 6 + [ADV_POSITIVE] * 3
    assert stats["tasks"]["rollcap/PushBlock-v0"]["threshold"] == pytest.approx(6.3)
    assert stats["human_steps"] == 1 and stats["positive_fraction"] == pytest.approx(0.4)


# ------------------------------------------------------------------ improve
@pytest.mark.slow
def test_fine_tune_is_deterministic_and_beta_travels_in_the_checkpoint(tiny_run, tmp_path):
    """Same seed, same weights; with_beta changes the config (and so the checkpoint JSON), not the weights."""
    from rollcap.policies import load_policy, save_policy

    steps, _ = collect.read_runs([tiny_run], horizon=4)
    labels = np.where(np.arange(len(steps)) % 2 == 0, ADV_POSITIVE, ADV_NEGATIVE)
    digests = []
    for windows in ("steps", "steps", "boundaries"):
        torch.manual_seed(0)
        p = FlowVLA(POLICY)
        improve.fine_tune(p, steps, labels, None, n_steps=4, batch=8, lr=1e-3, seed=4, windows=windows)
        digests.append(tensor_digest(p.state_dict()))
    assert digests[0] == digests[1] != digests[2]
    digests[0] = digests[2]
    q = improve.with_beta(p, 2.5)
    assert q.cfg.cfg_beta == 2.5 and tensor_digest(q.state_dict()) == digests[0]
    save_policy(q, tmp_path / "p")
    assert load_policy(tmp_path / "p.json").cfg.cfg_beta == 2.5


# ----------------------------------------------------------------- evaluate
def test_paired_statistics():
    """Wilson intervals, the paired difference and the exact McNemar p on hand-counted outcomes."""
    before = np.array([1] * 10 + [0] * 10, bool)
    after = np.array([1] * 10 + [1] * 6 + [0] * 4, bool)
    r = evaluate.paired(before, after)
    assert (r["fixed"], r["broken"]) == (6, 0)
    assert r["mcnemar_p"] == pytest.approx(2 / 64)
    assert r["difference_ci"][0] == pytest.approx(0.3)
    assert r["failure_rate_ratio"] == pytest.approx(0.4)
    p, lo, hi = r["before"]["rate_ci"]
    assert p == 0.5 and lo == pytest.approx(0.2993, abs=1e-3) and hi == pytest.approx(0.7007, abs=1e-3)
    assert evaluate.mcnemar_p(0, 0) == 1.0 and evaluate.mcnemar_p(3, 3) == 1.0


def test_held_out_seeds_are_their_own_stream():
    """Validation and held-out streams differ from each other and from episode_seed's; an overlap is refused."""
    val, test = evaluate.stream_seeds(0, evaluate.VALIDATION, 50), evaluate.stream_seeds(0, evaluate.TEST, 50)
    runs = {episode_seed(s, i) for s in range(4) for i in range(50)}
    assert len(set(val) | set(test)) == 100 and not (set(val) | set(test)) & runs
    assert evaluate.stream_seeds(0, evaluate.TEST, 3) == test[:3]
    with pytest.raises(ValueError, match="overlap"):
        evaluate.check_disjoint(test, {test[7]}, "held-out")


def test_config_errors_name_the_field():
    """A bad value is a ConfigError naming its field; comma lists become numbers."""
    assert RecapConfig(betas="1,2.5", execute_steps="4,8").betas == (1.0, 2.5)
    assert RecapConfig(execute_steps=("4", "8")).execute_steps == (4, 8)
    for kw, field in (
        ({"percentile": 100}, "percentile"),
        ({"betas": "1,1"}, "betas"),
        ({"execute_steps": "0"}, "execute_steps"),
        ({"policy_steps": 0}, "policy_steps"),
        ({"policy_lr": 2}, "policy_lr"),
        ({"windows": "chunks"}, "windows"),
    ):
        with pytest.raises(ConfigError) as err:
            RecapConfig(**kw)
        assert err.value.field == field


# ---------------------------------------------------------------- end to end
def _rollcap(*args):
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_recap_cli_end_to_end(tiny_run, ckpt, tmp_path):
    """rollcap recap on a tiny budget: every stage runs, the manifest says what was used, recordings made with the result name it."""
    out = tmp_path / "iter"
    tiny = ["--policy", ckpt[1], "--critic", ckpt[3], "--demos", 2, "--critic-steps", 2, "--policy-steps", 2, "--batch", 4,
            "--val-episodes", 1, "--eval-episodes", 2, "--betas", "1,2", "--execute-steps", "2,4"]  # fmt: skip
    res = _rollcap("recap", tiny_run, "--out", out, *tiny)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "McNemar" in res.stdout
    m = json.loads(
        (out / "recap.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in recap.json")
    )  # strict
    assert set(m["evaluate"]["results"]) == {"2", "4"} and m["evaluate"]["seeds"]["n"] == 2
    assert m["collect"]["censored"] == 2 and m["inputs"]["runs"][0]["path"] == str(tiny_run)
    assert m["policy"]["to_digest"] != m["policy"]["from_digest"] and m["improve"]["beta"] in (1.0, 2.0)
    assert m["advantage"]["percentile"] == 60.0 and m["config"]["policy_steps"] == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "critic.json",
        "critic.safetensors",
        "policy.json",
        "policy.safetensors",
        "recap.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the staging directory became out

    import rollcap
    from rollcap.rollout.recording import load_any

    rollcap.run(
        1,
        out=tmp_path / "after",
        policy=out / "policy.json",
        critic="none",
        env_kwargs=ENV_KW,
        max_chunks=2,
        progress=False,
        formats=("npz",),
    )
    rec = load_any(tmp_path / "after")[0]
    assert rec.fingerprints["policy"]["weights_digest"] == m["policy"]["to_digest"]
    assert rec.fingerprints["policy"]["config"]["cfg_beta"] == m["improve"]["beta"]


def test_recap_cli_refuses_bad_input_in_one_line(tiny_run, ckpt, tmp_path, capsys):
    """A non-empty --out, a missing run or a bad list: exit 2, one line naming it, nothing written."""
    from rollcap.rollout.cli import _main

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    tiny = [
        "--policy",
        ckpt[1],
        "--critic",
        ckpt[3],
        "--demos",
        "0",
        "--critic-steps",
        "0",
        "--policy-steps",
        "1",
        "--val-episodes",
        "0",
        "--eval-episodes",
        "1",
        "--execute-steps",
        "2,4",
    ]
    for argv, needle in (([str(tiny_run), "--out", str(tmp_path / "full")], "--out"), ([str(tmp_path / "nothing"), "--out", str(tmp_path / "x")], "nothing"),
                         ([str(tiny_run), "--out", str(tmp_path / "x"), "--betas", "1,a"], "--betas"),
                         ([str(tiny_run), "--out", str(tmp_path / "x"), "--execute-steps", "4,9"], "--execute-steps: the policy's chunks hold 4")):  # fmt: skip
        assert _main(["recap", *tiny, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and err.startswith("rollcap recap: error:")
    assert not (tmp_path / "x").exists() and [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_recap_help_lists_every_config_field(capsys):
    """rollcap recap --help: one flag per RecapConfig field, with an example."""
    import dataclasses

    from rollcap.rollout.cli.commands import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["recap", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "example:" in text and "RUN_DIR" in text and "--out" in text
    for f in dataclasses.fields(RecapConfig):
        assert "--" + f.name.replace("_", "-") in text
