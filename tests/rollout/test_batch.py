"""The batched episode core: rows never mix, every episode is its own, batched runs repeat and replay exactly."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rollcap
from rollcap.critics import CriticRunner, ValueCritic, save_critic
from rollcap.kernels.errors import BadInput
from rollcap.policies import FlowVLA, PolicyRunner, save_policy
from rollcap.rollout.batch import BatchedCore, row_views
from rollcap.rollout.build import runners
from rollcap.rollout.spec import Parts
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.offline.replay import Replayer, closed_loop_host, replay_closed, replay_env, replay_policy
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.seeding import episode_seed
from tests.rollout._tiny import CRITIC, ENV_KW, POLICY, first_obs, flow_noise, make_env


def _models(seed: int = 0):
    torch.manual_seed(seed)
    return FlowVLA(POLICY).eval(), ValueCritic(CRITIC).eval()


def _batched(n: int, seed: int = 0):
    p, c = _models(seed)
    return PolicyRunner(p, batch=n), CriticRunner(c, batch=n)


def test_rows_never_mix():
    """A row's chunk and value are the same bytes whatever the other rows hold (zeros, other episodes, NaN) and whichever row it is."""
    policy, critic = _batched(4)
    obs, noise = first_obs(0), flow_noise(0)
    others = [(first_obs(s), flow_noise(s)) for s in (1, 2, 3)]

    def row(r: int, fill) -> tuple[bytes, float]:
        for i in range(4):
            if i == r:
                policy.load_row(i, obs, noise)
                critic.load_row(i, obs)
            else:
                fill(i)
        for runner in (policy, critic):
            runner.launch()
            runner.wait()
        return policy.row_result(r).tobytes(), critic.row_result(r)

    def zeros(i):
        for runner in (policy, critic):
            for buf in runner.inputs.tensors().values():
                buf[i].zero_()

    def episodes(i):
        o, z = others[i % 3]
        policy.load_row(i, o, z)
        critic.load_row(i, o)

    def garbage(i):
        for runner in (policy, critic):
            runner.inputs["state"][i].fill_(float("nan"))
        policy.inputs["noise"][i].fill_(float("inf"))

    want = row(0, zeros)
    assert all(row(r, fill) == want for r in range(4) for fill in (zeros, episodes, garbage))


def test_batch_in_fingerprint_and_close_to_batch_1():
    """The batch is in a batched runner's fingerprint (batch 1's has none); its rows equal batch 1's within float32 rounding."""
    p, c = _models()
    one, four = PolicyRunner(p), PolicyRunner(p, batch=4)
    assert "batch" not in one.state_fingerprint() and four.state_fingerprint()["batch"] == 4
    assert CriticRunner(c, batch=4).state_fingerprint()["batch"] == 4
    obs, noise = first_obs(1), flow_noise(1)
    four.load_row(2, obs, noise)
    four.launch()
    four.wait()
    np.testing.assert_allclose(four.row_result(2), one.act(obs, noise), rtol=0, atol=1e-5)


def _core_run(todo, n: int = 3, graphs: int = 1, **cfg) -> dict[int, object]:
    pairs = [_batched(n // graphs) for _ in range(graphs)]
    policy, critic = ([p for p, _ in pairs], [c for _, c in pairs]) if graphs > 1 else pairs[0]
    core = BatchedCore([make_env() for _ in range(n)], policy, critic, HostConfig(seed=7, max_chunks=6, **cfg))
    try:
        return {e.index: e for e in core.episodes(todo)}
    finally:
        core.close()


def test_each_episode_is_its_own_whatever_its_slot():
    """Episodes run in other slots and orders (and past the last slot's work) are the same bytes; seeds are batch 1's."""
    a = _core_run(range(5))
    b = _core_run([4, 3, 2, 1, 0])
    c = _core_run([2], n=3)  # two slots idle the whole run
    assert sorted(a) == sorted(b) == list(range(5))
    for i in range(5):
        assert a[i].seed == episode_seed(7, i)
        assert a[i].record.fingerprints["policy"]["batch"] == 3
        assert episode_digest(a[i].record) == episode_digest(b[i].record)
    assert episode_digest(c[2].record) == episode_digest(a[2].record)


def test_graphs_split_the_envs_and_keep_each_episode():
    """4 envs on 2 graphs at batch 2 give the episodes 2 envs on one graph at batch 2 give, byte for byte."""
    split, one = _core_run(range(5), n=4, graphs=2), _core_run(range(5), n=2)
    assert [episode_digest(split[i].record) for i in range(5)] == [episode_digest(one[i].record) for i in range(5)]
    assert split[0].record.fingerprints["policy"]["batch"] == 2
    with pytest.raises(ConfigError, match="graphs"):
        rollcap.run(1, envs=4, graphs=3)


def test_batched_episodes_replay_exactly_at_their_batch():
    """Every mode replays a batched episode exactly through one row of runners at the recorded batch."""
    ends = _core_run(range(4))
    policy, critic = row_views(*_batched(3), row=1)
    env = make_env()
    for end in ends.values():
        rec = end.record
        assert replay_policy(rec, policy, critic).status == "exact"
        assert replay_env(rec, env).status == "exact"
        assert replay_closed(rec, closed_loop_host(rec, env, policy, critic)).status == "exact"


def test_refusals():
    """A batched core refuses a runner of another batch, real-time chunking and a control period, naming the field."""
    policy, critic = _batched(2)
    envs = [make_env(), make_env()]
    with pytest.raises(ConfigError, match="envs"):
        BatchedCore(envs + [make_env()], policy, critic)
    with pytest.raises(ConfigError, match="chunking"):
        BatchedCore(envs, policy, critic, HostConfig(chunking="naive"))
    with pytest.raises(ConfigError, match="control_period_s"):
        BatchedCore(envs, policy, critic, HostConfig(control_period_s=0.05))
    for bad in (0, -1, 2000, True):
        with pytest.raises(ConfigError, match="envs"):
            rollcap.run(1, envs=bad)
    with pytest.raises(ConfigError, match="envs"):
        rollcap.run(1, env=make_env(), envs=2)


def test_run_envs_repeats_and_replays(tmp_path):
    """``rollcap.run(envs=3)`` twice gives the same digests; ``Replayer`` (rollcap replay) finds every episode exact in all modes."""
    p, c = _models(1)
    pol, cri = save_policy(p, tmp_path / "p"), save_critic(c, tmp_path / "c")
    kw = dict(env_kwargs=ENV_KW, policy=pol, critic=cri, envs=3, max_chunks=5, progress=False, formats=("npz",))
    runs = [rollcap.run(5, out=tmp_path / f"r{k}", **kw).records() for k in range(2)]
    assert [episode_digest(r) for r in runs[0]] == [episode_digest(r) for r in runs[1]]
    replayer = Replayer(Parts(env_kwargs=ENV_KW, policy=pol, critic=cri))
    try:
        results = [res for rec in runs[0] for res in replayer.check("run", rec, ("policy", "env", "closed"))]
    finally:
        replayer.close()
    assert len(results) == 15 and all(r.status == "exact" for r in results), [r.line() for r in results]


def test_batched_runners_check_the_env():
    """Batched runners are checked against the env's observations like batch 1's (a misfit is a ConfigError)."""
    with pytest.raises(ConfigError):
        runners(Parts(critic=None), make_env(), envs=2)  # the shipped policy reads 64 px images, this env renders 32


@pytest.mark.cuda
def test_cuda_batched_rows_never_mix_and_replay_exactly():
    """On CUDA: the batch-4 graph captures, a row is the same bytes whatever the other rows hold, and replays exactly."""
    torch.manual_seed(0)
    p, c = (
        PolicyRunner(FlowVLA(POLICY).eval(), device="cuda", batch=4),
        CriticRunner(ValueCritic(CRITIC).eval(), device="cuda", batch=4),
    )
    obs, noise = first_obs(0), flow_noise(0)
    got = []
    for other in (1, 2):
        for i in range(4):
            p.load_row(i, obs if i == 3 else first_obs(other), noise if i == 3 else flow_noise(other))
        p.launch()
        p.wait()
        got.append(p.row_result(3).tobytes())
    assert got[0] == got[1]
    policy, critic = row_views(p, c, row=0)
    policy.start(obs, noise)
    assert policy.result().tobytes() == got[0]


def _with_slot_1(env) -> tuple[dict, dict]:
    """Episodes 0-4 on three slots, slot 1's env ``env``, and the same episodes on three plain envs: (ends, clean)."""
    policy, critic = _batched(3)
    core = BatchedCore([make_env(), env, make_env()], policy, critic, HostConfig(seed=7, max_chunks=6))
    try:
        ends = {e.index: e for e in core.episodes(range(5))}
    finally:
        core.close()
    return ends, _core_run(range(5))


def test_an_env_error_ends_only_its_episode():
    """An env that raises mid-chunk ends that slot's episode with stop reason error; the other slots' episodes are untouched."""
    from tests.rollout.test_episode_core import RaiseAtStep

    ends, clean = _with_slot_1(RaiseAtStep(make_env(), at=3, episodes={0}))
    assert ends[1].stop_reason == "error" and "motor driver fault" in ends[1].error
    assert ends[3].stop_reason != "error"  # slot 1's next episode runs on
    for i in (0, 2):  # the other slots' episodes are the bytes of a run without the fault
        assert episode_digest(ends[i].record) == episode_digest(clean[i].record)


class NaNStateAtStep(gym.Wrapper):
    """An env whose observation's state turns NaN from its ``at``-th step of its first episode on (a simulation that blew up)."""

    def __init__(self, env, at: int):
        super().__init__(env)
        self.at, self.n, self.episode = at, 0, -1

    def reset(self, **kw):
        self.n, self.episode = 0, self.episode + 1
        return self.env.reset(**kw)

    def step(self, action):
        obs, *rest = self.env.step(action)
        self.n += 1
        if self.episode == 0 and self.n >= self.at:
            obs = {**obs, "state": np.full_like(obs["state"], np.nan)}
        return (obs, *rest)


def test_a_nonfinite_observation_ends_only_its_episode_before_its_chunk_runs():
    """The rows' launch checks the batch's float inputs at once: a slot whose state turned NaN ends with load_row's
    error (no action of that chunk stepped), its slot runs on, and the other slots' episodes are the bytes of a
    clean run (the bad row replayed beside them). A NaN in a row's noise (a resumed episode's recorded noise) is
    refused the same way, naming the noise."""
    ends, clean = _with_slot_1(NaNStateAtStep(make_env(), at=3))
    bad = ends[1]
    assert bad.stop_reason == "error" and bad.error == "BadInput: observation['state']: contains NaN or Inf"
    assert (bad.num_chunks, bad.num_steps) == (1, 4)  # the NaN came at step 3 of the first chunk; the next never ran
    assert np.isnan(bad.record.final_obs["state"]).all()
    assert ends[3].stop_reason != "error"  # slot 1's next episode runs on
    for i in (0, 2):  # the other slots' (slot 1's env is wrapped: its records name another env)
        assert episode_digest(ends[i].record) == episode_digest(clean[i].record)

    p, c = _batched(2)
    core = BatchedCore([make_env(), make_env()], p, c, HostConfig(seed=1))
    try:
        rp, rows = core.hosts[0].policy, core.policy_rows[0]
        noise = flow_noise(0)
        noise[1, 1] = np.inf
        rp.start(first_obs(0), noise)  # shapes and dtypes are checked here; the batch's values at its launch
        core.hosts[1].policy.start(first_obs(1), flow_noise(1))
        rows.launch()
        assert rows.failed == {0: "noise: contains NaN or Inf"}
        with pytest.raises(BadInput, match=r"^noise: contains NaN or Inf$"):
            rp.result()
        assert np.isfinite(core.hosts[1].policy.result()).all()
        with pytest.raises(BadInput, match="noise: expected float32"):
            rp.start(first_obs(0), noise.astype(np.float64))
    finally:
        core.close()


def test_a_row_whose_chunk_is_not_finite_stops_and_only_that_row():
    """The replay's chunk output is checked once a replay: all finite, each row's view says so and NonFiniteAction
    asks nothing more; a row with a NaN, and the checks are every row's own: that episode stops before its chunk
    (nonfinite_action), the other goes on. (The stand-in's replay leaves the output buffer as it is: NaN put there.)"""
    from rollcap.rollout.bench.standin_rows import FixedLatencyRows

    p, c = _batched(2)
    core = BatchedCore([make_env(), make_env()], FixedLatencyRows(p, 0.0), FixedLatencyRows(c, 0.0), HostConfig(seed=1))
    try:
        for i, h in enumerate(core.hosts):
            h.start(i)
        p.outputs["actions"].zero_()
        first = core.boundaries()
        assert [e.stop_reason for e in first] == [None, None]
        assert core.policy_rows[0].actions_finite is True and core.hosts[1].policy.chunk_finite is True
        core.execute()
        p.outputs["actions"][1, 0, 0] = float("nan")
        second = core.boundaries()
        assert core.policy_rows[0].actions_finite is None
        assert [e.stop_reason for e in second] == [None, "nonfinite_action"]
        assert core.hosts[0].state is HostState.RUNNING and core.hosts[1].done
    finally:
        core.close()


def test_branch_of_a_batched_episode_has_an_exact_control(tmp_path):
    """``rollcap branch`` on an episode of a batched run builds a row of runners at the recorded batch, so its control
    (the parent's own noise from the boundary on) is the parent's continuation byte for byte."""
    from rollcap.rollout.api import branch_episode

    p, c = _models(2)
    pol, cri = save_policy(p, tmp_path / "p"), save_critic(c, tmp_path / "c")
    run = rollcap.run(
        3,
        out=tmp_path / "r",
        env_kwargs=ENV_KW,
        policy=pol,
        critic=cri,
        envs=3,
        max_chunks=5,
        progress=False,
        formats=("npz",),
    )
    longest = max(range(3), key=lambda i: len(next(iter(run.records()[i].chunks.values()))))
    result, summary = branch_episode(
        tmp_path / "r",
        longest,
        1,
        2,
        out=tmp_path / "b",
        formats=("npz",),
        parts=Parts(env_kwargs=ENV_KW, policy=pol, critic=cri),
    )
    assert result.fingerprint_diff == [] and result.control_diff is None, summary["control"]
    assert result.control is not None and len(result.records) == 3


def test_a_slots_critic_row_takes_the_observation_its_policy_row_checked_once():
    """The critic row writes the arrays the slot's policy row just checked (the same bytes load_row writes), only for
    that very observation and only once: a later or another observation is checked again (NaN refused)."""
    from rollcap.kernels.errors import BadInput

    policy, critic = _batched(2)
    core = BatchedCore([make_env(), make_env()], policy, critic, HostConfig(seed=1))
    try:
        rp, rc = core.hosts[1].policy, core.hosts[1].critic
        obs, noise = first_obs(3), flow_noise(3)
        rp.start(obs, noise)
        assert rc.handoff.values is not None
        rc.start(obs)
        assert rc.handoff.values is None  # taken
        rc.rows.launch()  # the rows are copied in with the batch's launch
        rc.rows.settle()
        written = {k: v[1].clone() for k, v in critic.inputs.tensors().items()}
        critic.load_row(1, first_obs(4))
        critic.load_row(1, obs)
        assert all(torch.equal(written[k], v[1]) for k, v in critic.inputs.tensors().items())
        bad = {**obs, "state": np.full_like(obs["state"], np.nan)}
        rp.start(obs, noise)
        with pytest.raises(BadInput, match="NaN"):
            rc.start(bad)  # another object: checked, not taken
        with pytest.raises(BadInput, match="NaN"):
            rc.start(bad)
    finally:
        core.close()


def test_critic_rows_of_the_policy_rows_arrays_are_copied_from_the_policy_s_buffers():
    """When every critic row holds the very arrays the policy's last launch copied in (the handoff's), the critic's
    inputs are copied from the policy's buffers: the bytes load_row writes. Rows checked on their own (other
    observations), or not every row written, are gathered from the rows whatever the policy's buffers hold."""
    policy, critic = _batched(2)
    core = BatchedCore([make_env(), make_env()], policy, critic, HostConfig(seed=1))
    pr, cr = core.policy_rows[0], core.critic_rows[0]

    def critic_inputs() -> dict:
        return {k: v.clone() for k, v in critic.inputs.tensors().items()}

    def as_load_row_writes(obs_of: dict) -> bool:
        written = critic_inputs()
        for i, obs in obs_of.items():
            critic.load_row(i, obs)
        return all(torch.equal(written[k], v) for k, v in critic.inputs.tensors().items())

    try:
        obs = {i: first_obs(10 + i) for i in range(2)}
        for i, h in enumerate(core.hosts):
            h.policy.start(obs[i], flow_noise(i))
            h.critic.start(obs[i])
        assert cr._shared_inputs(list(cr._rows)) is None  # the policy's buffers do not hold them yet
        pr.launch()
        assert cr._shared_inputs(list(cr._rows)) is not None
        cr.launch()
        pr.settle(), cr.settle()
        assert as_load_row_writes(obs)

        other = {i: first_obs(20 + i) for i in range(2)}
        for i, h in enumerate(core.hosts):
            h.policy.start(obs[i], flow_noise(i))
            h.critic.start(other[i])  # another observation: checked by the critic row itself
        pr.launch()
        assert cr._shared_inputs(list(cr._rows)) is None
        cr.launch()
        pr.settle(), cr.settle()
        assert as_load_row_writes(other)

        core.hosts[0].policy.start(obs[0], flow_noise(0))
        core.hosts[1].policy.start(obs[1], flow_noise(1))
        core.hosts[1].critic.start(obs[1])  # one critic row only: gathered, the other row left as it is
        pr.launch()
        cr.launch()
        pr.settle(), cr.settle()
        assert as_load_row_writes({0: other[0], 1: obs[1]})
    finally:
        core.close()
