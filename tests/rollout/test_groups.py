"""Groups from one capsule and continuations from one boundary on the batched core: byte-identical starts, own noise,
each episode replays exactly (its chunks' log-probabilities too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollcap.policies import FlowVLA
from rollcap.policies.flow_sde import FlowSDERunner, step_logp
from rollcap.rollout.batch import BatchedCore, row_views
from rollcap.rollout.build import build
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.groups import Collector, boundary_of, run_slots, start_state
from rollcap.rollout.offline.replay import closed_loop_host, replay_closed, replay_policy
from rollcap.rollout.protocols import observation_at
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec
from tests.rollout._tiny import POLICY, make_env

G = 4


def _runner(batch: int = G) -> FlowSDERunner:
    torch.manual_seed(0)
    return FlowSDERunner(FlowVLA(POLICY).eval(), batch=batch)


@pytest.fixture(scope="module")
def group():
    """One capsule, G episodes started at it on a Flow-SDE graph at batch G, records kept."""
    runner, collector = _runner(), Collector()
    core = BatchedCore(
        [make_env() for _ in range(G)], runner, None, HostConfig(execute_steps=4, max_chunks=6), [collector]
    )
    scratch = make_env()
    at = start_state(scratch, 123)
    ends = run_slots(core, [(i, episode_seed(7, i), at) for i in range(G)])
    yield runner, core, at, ends, collector.take()
    core.close()
    scratch.close()


def test_a_group_starts_byte_identical_and_differs_only_in_noise(group):
    """Every member's initial env state and first observation are the capsule's, byte for byte (a restore, not a
    re-seed: their own seeds differ); their noise, and so their chunks, differ."""
    _, _, at, ends, _ = group
    recs = [e.record for e in ends]
    for r in recs:
        assert sorted(r.initial_state) == sorted(at.env_state)
        assert all(r.initial_state[k].tobytes() == np.asarray(at.env_state[k]).tobytes() for k in at.env_state)
        first = observation_at(r, 0)
        assert all(np.asarray(first[k]).tobytes() == np.asarray(at.obs[k]).tobytes() for k in ("state", "image_front"))
        assert r.origin["parent"] == "group" and r.origin["seed"] == 123
    assert len({r.seed for r in recs}) == G
    assert len({r.chunks["noise"][0].tobytes() for r in recs}) == G
    assert len({r.chunks["policy_chunk"][0].tobytes() for r in recs}) == G


def test_each_member_records_its_flow_and_replays_exactly(group):
    """A member's record holds each chunk's step noise, trace and log-probabilities; policy replay on a row of a
    fresh graph at the recorded batch gives them back byte for byte, closed-loop replay the whole episode; the
    log-probabilities recomputed from the recorded trace by the learner's function agree."""
    runner, _, _, ends, kept = group
    rec = ends[2].record
    assert rec.chunks["flow_logp"].shape == (rec.num_chunks, POLICY.num_steps)
    assert rec.chunks["flow_trace"].shape == (rec.num_chunks, POLICY.num_steps + 1, POLICY.horizon, POLICY.action_dim)
    fresh = _runner()
    policy, _ = row_views(fresh)
    res = replay_policy(rec, policy)
    assert res.exact and not res.fingerprint_diff, res.line()
    res = replay_closed(rec, closed_loop_host(rec, make_env(), policy))
    assert res.exact, res.line()
    spec = fresh.cfg.obs_spec
    x = [spec.to_inputs(observation_at(rec, int(s))) for s in rec.chunks["chunk_start"]]
    cat = lambda k: torch.from_numpy(np.concatenate([v[k] for v in x]))  # noqa: E731
    with torch.no_grad():
        lp = step_logp(fresh.model, [cat("image_front")], cat("state"), cat("tokens"),
                       torch.from_numpy(rec.chunks["flow_trace"]), fresh.noise_level)  # fmt: skip
    assert np.allclose(lp.numpy(), rec.chunks["flow_logp"], atol=1e-4)
    ep = kept[rec.index]  # the collector's copy: what the learner gets
    assert np.array_equal(np.stack([f["logp"] for f in ep.flow]), rec.chunks["flow_logp"])
    assert ep.weights == runner.state_fingerprint()["weights_digest"] and ep.success == rec.success


def test_continuations_from_one_boundary_start_there(group):
    """K continuations from a running episode's boundary (boundary_of) start in its exact state and observation and
    count their chunks from it; their own noise differs."""
    runner, core, at, _, _ = group
    h = core.hosts[0]
    h.start(100, episode_seed(7, 100), at)
    core.open_pool()
    for _ in range(2):
        core.round(active=[True] + [False] * (G - 1))
    mid = boundary_of(h, [float("nan")] * 2, "branch")
    state_now = {k: np.array(v) for k, v in h.state_env.get_state().items()}
    h.finish()
    assert mid.chunk == 2 and mid.origin["parent"] == "branch"
    ends = run_slots(core, [(200 + i, episode_seed(7, 200 + i), mid) for i in range(G)])
    for e in ends:
        r = e.record
        assert all(r.initial_state[k].tobytes() == state_now[k].tobytes() for k in state_now)
        assert np.asarray(observation_at(r, 0)["state"]).tobytes() == np.asarray(mid.obs["state"]).tobytes()
    assert len({e.record.chunks["noise"][0].tobytes() for e in ends}) == G


def test_sde_is_refused_on_env_workers():
    """The sde sampler records each chunk's log-probabilities beside it; env workers do not carry them: one line."""
    with pytest.raises(ConfigError, match="^sampler: sde records"):
        build(Spec(Parts(sampler="sde"), run=RunConfig(envs=2, env_workers=2)), check_env=False)
