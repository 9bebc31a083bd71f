"""Flow RL: the advantages' arithmetic, a tiny training run (one capture per graph, weights in place, recorded
episodes that replay exactly in a fresh process with the weights they name), resume after Ctrl-C is the run that
did not stop (the example's door: tests/examples/test_flow_rl.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rollcap.rollout.learn.flow_rl import Interrupted, TrainConfig, find_weights, train
from rollcap.rollout.learn.flow_rl.learner import gae, group_advantages
from rollcap.rollout.recording import read_npz

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(max_iterations=3, groups=2, group_size=2, heldin_every=0, record_every=1, log_every_s=0.0)


def test_group_advantages_are_relative_to_the_group():
    """GRPO: each episode's return less its group's mean, over the group's std; a group that ended alike gets 0."""
    r = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    g = np.array([0, 0, 0, 0, 1, 1])
    a = group_advantages(r, g)
    assert np.allclose(a[:4], (r[:4] - 0.25) / (np.std(r[:4]) + 1e-6)) and np.all(a[4:] == 0)
    assert np.allclose(group_advantages(r, g, normalize=False)[:4], r[:4] - 0.25)


def test_gae_is_the_discounted_td_sum():
    """GAE over one episode's chunks equals the lambda-weighted sum of TD errors; returns are advantages + values."""
    rew, v = np.array([0.0, 0.0, 1.0], np.float32), np.array([0.2, 0.5, 0.7], np.float32)
    adv, ret = gae(rew, v, 0.0, 0.9, 0.8)
    d = [0 + 0.9 * 0.5 - 0.2, 0 + 0.9 * 0.7 - 0.5, 1 - 0.7]
    want = [d[0] + 0.72 * d[1] + 0.72**2 * d[2], d[1] + 0.72 * d[2], d[2]]
    assert np.allclose(adv, want) and np.allclose(ret, adv + v)


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Three tiny GRPO iterations, every one recorded."""
    out = tmp_path_factory.mktemp("flow") / "a"
    res = train(TrainConfig(**TINY), out, progress=lambda s: None)
    return out, res


@pytest.mark.slow(seconds=20)
def test_a_tiny_run_keeps_one_capture_and_names_its_weights(straight):
    """The rollout graph is captured once and never again; each iteration ran with the weights the last update
    copied in (a new digest each), recorded with its episodes, and its checkpoint is kept under that digest."""
    out, res = straight
    b = res["budget"]
    assert b["capture_count"] == {"graphs": 1, "captures_during_training": 0}
    assert b["iterations"] == 3 and b["episodes"] == 12 and b["transitions"] > 0 and b["minutes"] >= 0
    digests = [d for _, _, d, _ in res["recorded"]]
    assert len(set(digests)) == 3 and [p["weights"] for p in res["curve"]] == [d[:19] for d in digests]
    for it, indices, digest, path in res["recorded"]:
        assert find_weights(out, digest) == out / path
        for i in indices:
            rec = read_npz(out / "episodes" / f"episode_{i:05d}.npz")
            assert (
                rec.fingerprints["policy"]["weights_digest"] == digest
                and rec.fingerprints["policy"]["sampler"] == "sde"
            )


@pytest.mark.slow(seconds=25)
def test_a_training_episode_replays_exactly_in_a_fresh_process(straight):
    """An episode of the last iteration (weights two updates from the shipped ones), replayed by `rollcap replay` in a
    new process with the checkpoint its fingerprint names: policy (its log-probabilities too), env and closed loop
    exact."""
    out, res = straight
    it, indices, digest, path = res["recorded"][-1]
    episode = out / "episodes" / f"episode_{indices[1]:05d}.npz"
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(episode), "--policy", str(out / path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "3 exact, 0 diverged, 0 not comparable, 0 failed -- all exact" in run.stdout, run.stdout
    assert "recorded with the sde sampler: replaying with it" in run.stderr


@pytest.mark.slow(seconds=25)
def test_resume_after_ctrl_c_is_the_run_that_did_not_stop(straight, tmp_path):
    """A Ctrl-C after the second iteration's log line saves the state of the last finished iteration; resuming
    ends with the same weights, the same curve and the same recorded episodes as the run that never stopped."""
    out_a, res_a = straight
    out = tmp_path / "b"

    def stop(line: str) -> None:
        if line.startswith("iteration=2 "):
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as err:
        train(TrainConfig(**TINY), out, progress=stop)
    assert err.value.iteration == 1 and (out / "state" / "state.json").is_file()
    res = train(TrainConfig(**TINY), out, progress=lambda s: None, resume=True)
    a, b = _weights(res_a["model"]), _weights(res["model"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda c: [{k: v for k, v in p.items() if not k.endswith("_s") and k != "seconds"} for p in c]  # noqa: E731
    assert strip(res["curve"]) == strip(res_a["curve"])
    for _, indices, _, _ in res["recorded"]:
        for i in indices:
            ra, rb = (read_npz(o / "episodes" / f"episode_{i:05d}.npz") for o in (out_a, out))
            assert ra.chunks["flow_logp"].tobytes() == rb.chunks["flow_logp"].tobytes()
    with pytest.raises(ValueError, match="saved by a run with other settings \\(lr\\)"):
        train(TrainConfig(**{**TINY, "lr": 1e-4}), out, progress=lambda s: None, resume=True)


def test_branch_advantages_split_an_episode_at_its_measured_value():
    """VinePPO's split: chunks before the branch point get V_j - V_0, the rest R - V_j; a group that ended alike
    still credits its segments (no division by its zero std); without a branch point an episode gets R - V_0."""
    from rollcap.rollout.learn.flow_rl.advantages import branch_advantages

    returns, groups = np.array([1.0, 1.0, 0.0, 1.0]), np.array([0, 0, 1, 1])
    out = branch_advantages([3, 2, 4, 2], returns, groups, {0: (1, 0.25), 2: (2, 0.75)}, normalize=False)
    assert np.allclose(out[0], [0.25 - 1, 1 - 0.25, 1 - 0.25]) and np.allclose(out[1], [0, 0])
    assert np.allclose(out[2], [0.75 - 0.5, 0.75 - 0.5, -0.75, -0.75]) and np.allclose(out[3], [0.5, 0.5])
    norm = branch_advantages([3, 2, 4, 2], returns, groups, {0: (1, 0.25), 2: (2, 0.75)})
    assert max(np.abs(np.concatenate(norm))) < 3
