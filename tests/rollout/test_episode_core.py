"""The steppable episode core: driven from outside, exception-safe, any ChunkPolicy, critic optional."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rollcap.kernels.fingerprint import device_fingerprint, tensor_digest
from rollcap.rollout.episode import ACTOR_AGENT, ACTOR_POLICY
from rollcap.rollout.errors import ConfigError, IllegalTransition
from rollcap.rollout.config import HostConfig
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import ChunkPolicy, Subscriber
from rollcap.rollout.offline.replay import replay_closed, replay_env, replay_policy
from tests.rollout._tiny import make_env


class StatePolicy:
    """A user's eager nn.Module behind the ChunkPolicy protocol: a linear map of the proprio state (no capture, no lane)."""

    def __init__(self, horizon: int = 4, action_dim: int = 2, state_dim: int = 28):
        torch.manual_seed(0)
        self.net = torch.nn.Linear(state_dim + horizon * action_dim, horizon * action_dim).eval()
        self.chunk_shape = (horizon, action_dim)
        self._out: np.ndarray | None = None

    def reset(self) -> None:
        self._out = None

    def start(self, obs, noise) -> None:
        x = torch.cat([torch.from_numpy(np.asarray(obs["state"], np.float32)), torch.from_numpy(noise).reshape(-1)])
        with torch.no_grad():
            self._out = torch.tanh(self.net(x)).reshape(self.chunk_shape).numpy().copy()

    def result(self) -> np.ndarray:
        return self._out

    def state_fingerprint(self) -> dict:
        return {**device_fingerprint("cpu"), "weights_digest": tensor_digest(self.net.state_dict())}


class RaiseAtStep(gym.Wrapper):
    """An env that raises on its ``at``-th step of every episode listed in ``episodes``."""

    def __init__(self, env, at: int, episodes: set[int]):
        super().__init__(env)
        self.at, self.episodes, self.n, self.episode = at, episodes, 0, -1

    def reset(self, **kw):
        self.n, self.episode = 0, self.episode + 1
        return self.env.reset(**kw)

    def step(self, action):
        self.n += 1
        if self.episode in self.episodes and self.n == self.at:
            raise RuntimeError("motor driver fault")
        return self.env.step(action)


def test_a_user_eager_policy_runs_without_a_critic_and_replays_exactly():
    """An eager nn.Module policy with no critic is recorded (NaN values, no critic fingerprint) and replays exactly in all modes."""
    policy = StatePolicy()
    assert isinstance(policy, ChunkPolicy)
    env = make_env()
    host = RolloutHost(env, policy, None, HostConfig(seed=4, max_chunks=3))
    rec = host.run_episode(0).record
    assert rec.num_chunks == 4 and rec.num_steps == 12 and rec.stop_reason == "timeout_chunks"
    assert np.isnan(rec.chunks["critic_value"]).all()
    assert "critic" not in rec.fingerprints
    assert replay_policy(rec, policy).exact
    assert replay_env(rec, make_env()).exact
    assert replay_closed(rec, RolloutHost(make_env(), StatePolicy(), None, HostConfig.from_json(rec.config))).exact


def test_critic_threshold_without_a_critic_is_refused():
    """A critic stop rule with no critic is a config error naming the field."""
    with pytest.raises(ConfigError, match="critic_threshold"):
        RolloutHost(make_env(), StatePolicy(), None, HostConfig(critic_threshold=-0.5))


def test_execute_steps_beyond_the_chunk_is_refused():
    """execute_steps larger than the policy's horizon is refused (it was silently capped and recorded as asked)."""
    with pytest.raises(ConfigError, match="execute_steps: the policy's chunks hold 4 actions, got 1000"):
        RolloutHost(make_env(), StatePolicy(), None, HostConfig(execute_steps=1000))


def test_driven_step_by_step_from_outside(runners):
    """start -> boundary -> execute ... -> finish, driven by the caller, equals run_episode byte for byte."""
    host = RolloutHost(make_env(), *runners, HostConfig(seed=6, max_chunks=4))
    whole = host.run_episode(1).record
    obs = host.start(1)
    assert obs is not None and host.state is HostState.RUNNING
    while not host.done:
        event = host.boundary()
        assert event.chunk == host.book.chunk - 1 == host.book.counters[1] - 1
        if not host.done:
            steps = host.execute()
            assert all(s.actor == ACTOR_POLICY for s in steps)
    stepped = host.finish().record
    for table in ("steps", "obs", "initial_state"):
        for k, v in getattr(whole, table).items():
            assert v.tobytes() == getattr(stepped, table)[k].tobytes(), (table, k)
    assert whole.chunks["policy_chunk"].tobytes() == stepped.chunks["policy_chunk"].tobytes()
    assert host.state is HostState.RESET


def test_calls_out_of_order_raise(runners):
    """execute before boundary, boundary twice, start while running: IllegalTransition; the episode is still usable."""
    host = RolloutHost(make_env(), *runners, HostConfig(seed=1))
    with pytest.raises(IllegalTransition, match="boundary"):
        host.boundary()
    host.start(0)
    with pytest.raises(IllegalTransition, match="boundary"):
        host.execute()
    host.boundary()
    with pytest.raises(IllegalTransition, match="twice"):
        host.boundary()
    with pytest.raises(IllegalTransition, match="start"):
        host.start(1)
    host.execute()
    end = host.finish("operator")
    assert end.stop_reason == "operator" and end.num_chunks == 1 and end.num_steps == 4


def test_an_outside_agent_chunk_is_executed_and_recorded_as_agent(runners):
    """execute(actions) runs the caller's chunk (any length) instead of the policy's; steps are marked ACTOR_AGENT."""
    host = RolloutHost(make_env(), *runners, HostConfig(seed=2))
    host.start(0)
    host.boundary()
    mine = np.full((3, 2), 0.25, np.float32)
    steps = host.execute(mine)
    assert [s.actor for s in steps] == [ACTOR_AGENT] * 3
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        host.boundary()
        host.execute(np.zeros((3, 5), np.float32))
    host.execute()  # the refused chunk left the boundary's chunk pending
    rec = host.finish().record
    np.testing.assert_array_equal(rec.steps["actions"][:3], mine)
    assert list(rec.steps["actor"][:3]) == [ACTOR_AGENT] * 3 and (rec.steps["actor"][3:] == ACTOR_POLICY).all()


def test_env_raising_mid_episode_ends_it_with_error_and_the_next_runs(runners):
    """An env exception becomes stop reason 'error' (type and message kept); the episode is recorded; the next one runs."""
    env = RaiseAtStep(make_env(), at=6, episodes={1})
    host = RolloutHost(env, *runners, HostConfig(seed=3, max_chunks=3))
    ends = host.run(3)
    assert [e.stop_reason for e in ends] == ["timeout_chunks", "error", "timeout_chunks"]
    bad = ends[1]
    assert bad.error == "RuntimeError: motor driver fault"
    assert bad.record.stop_reason == "error" and bad.record.error == bad.error
    assert bad.record.num_steps == 5  # the step that raised never happened
    assert ends[2].record.num_steps == 12 and host.state is HostState.RESET


def test_on_error_drop_and_raise(runners):
    """on_error='drop' builds no record; on_error='raise' records, re-raises, and leaves the host ready."""
    env = RaiseAtStep(make_env(), at=2, episodes={0})
    dropped = RolloutHost(env, *runners, HostConfig(seed=3, max_chunks=2), on_error="drop").run_episode(0)
    assert dropped.stop_reason == "error" and dropped.record is None and dropped.dropped
    env = RaiseAtStep(make_env(), at=2, episodes={0})
    host = RolloutHost(env, *runners, HostConfig(seed=3, max_chunks=2), on_error="raise")
    with pytest.raises(RuntimeError, match="motor driver fault"):
        host.run_episode(0)
    assert host.state is HostState.RESET
    assert host.run_episode(1).stop_reason == "timeout_chunks"


class FailingView(Subscriber):
    """A live view that crashes on a given chunk of a given episode."""

    def __init__(self, episode: int, chunk: int):
        self.episode, self.chunk = episode, chunk

    def on_chunk(self, chunk):
        if (chunk.episode, chunk.chunk) == (self.episode, self.chunk):
            raise ValueError("display went away")


def test_subscriber_raising_ends_the_episode_with_error(runners):
    """A subscriber's on_chunk exception ends that episode with 'error'; the chunk it saw is recorded unexecuted."""
    host = RolloutHost(make_env(), *runners, HostConfig(seed=5, max_chunks=3), [FailingView(episode=0, chunk=1)])
    ends = host.run(2)
    assert ends[0].stop_reason == "error" and ends[0].error == "ValueError: display went away"
    rec = ends[0].record
    assert rec.num_chunks == 2 and rec.num_steps == int(rec.chunks["chunk_start"][1]) == 4
    assert ends[1].stop_reason == "timeout_chunks"


def test_keyboard_interrupt_abandons_the_episode_and_leaves_the_host_ready(runners):
    """Ctrl-C inside an episode propagates, nothing is recorded, and the host can run the next episode."""

    class CtrlC(Subscriber):
        wants_records = True

        def __init__(self):
            self.ends = []

        def on_step(self, step):
            if step.episode == 0 and step.step == 3:
                raise KeyboardInterrupt

        def on_episode_end(self, end):
            self.ends.append(end.index)

    sub = CtrlC()
    host = RolloutHost(make_env(), *runners, HostConfig(seed=5, max_chunks=2), [sub])
    with pytest.raises(KeyboardInterrupt):
        host.run_episode(0)
    assert host.state is HostState.RESET and sub.ends == []
    assert host.run_episode(1).record.num_steps == 8 and sub.ends == [1]


def test_records_false_keeps_nothing_per_step(runners):
    """records=False: outcomes only, no record; a subscriber that needs records is refused."""
    end = RolloutHost(make_env(), *runners, HostConfig(seed=1, max_chunks=2), records=False).run_episode(0)
    assert end.record is None and end.num_steps == 8

    class Wants(Subscriber):
        wants_records = True

    with pytest.raises(ValueError, match="Wants"):
        RolloutHost(make_env(), *runners, subscribers=[Wants()], records=False)
