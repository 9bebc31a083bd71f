"""RolloutHost: transitions, capsule reset without recapture, stop predicates, events."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rollcap.kernels import capture_count
from rollcap.rollout.episode import ACTOR_HUMAN, ACTOR_POLICY
from rollcap.rollout.errors import ConfigError, IllegalTransition
from rollcap.rollout.events import EventBus
from rollcap.rollout.config import HostConfig
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.predicates import StopPredicate
from tests.rollout._tiny import make_env, make_runners


class ActionLog(gym.Wrapper):
    """Records every action the env actually receives."""

    def __init__(self, env):
        super().__init__(env)
        self.received: list[np.ndarray] = []

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        return self.env.step(action)


def _strip_timing(rec):
    return {k: v for k, v in rec.chunks.items() if not k.startswith("latency")}


def test_reset_restores_without_recapture_and_reproduces(runners):
    """Episodes after the first restore the initial capsule; re-running episode 0 is byte-identical."""
    host = RolloutHost(make_env(), *runners, HostConfig(seed=3, max_chunks=3))
    first = host.run_episode(0).record
    before = capture_count()
    host.run_episode(1)
    again = host.run_episode(0).record
    assert capture_count() == before
    assert again.chunks["policy_chunk"][0].tobytes() == first.chunks["policy_chunk"][0].tobytes()
    for k, v in _strip_timing(first).items():
        assert v.tobytes() == _strip_timing(again)[k].tobytes(), k
    for k, v in first.obs.items():
        assert v.tobytes() == again.obs[k].tobytes(), k
    assert host.state is HostState.RESET


def test_critic_stop_keeps_the_stopped_chunk_out_of_the_env(runners):
    """With the critic threshold firing at chunk 1, the env receives exactly chunk 0's actions."""
    env = ActionLog(make_env())
    # every value is <= 0, so threshold 0 fires on every chunk; patience 2 stops at chunk 1
    host = RolloutHost(env, *runners, HostConfig(seed=1, critic_threshold=0.0, critic_patience=2))
    rec = host.run_episode(0).record
    assert rec.stop_reason == "critic"
    assert rec.num_chunks == 2
    h = rec.chunks["policy_chunk"].shape[1]
    assert len(env.received) == h == rec.num_steps
    np.testing.assert_array_equal(np.stack(env.received), rec.chunks["policy_chunk"][0])
    assert not rec.success


def test_illegal_transitions_raise(runners):
    """run_episode outside RESET, and anything after close, raise IllegalTransition."""
    host = RolloutHost(make_env(), *make_runners(1))
    host.state = HostState.RUNNING
    with pytest.raises(IllegalTransition, match="needs state reset"):
        host.run_episode(0).record
    host.state = HostState.RESET
    host.close()
    with pytest.raises(IllegalTransition, match="closed -> closed"):
        host.close()


def test_event_stop_and_label(runners):
    """An external stop request ends the episode at the next step with its reason; mark() labels it."""
    events = EventBus()

    class StopAfter(StopPredicate):
        def check(self, view):
            if view.chunk == 1:
                events.request_stop("key")
                events.mark(True)
            return None

    host = RolloutHost(make_env(), *runners, HostConfig(seed=2), predicates=[StopAfter()], events=events)
    rec = host.run_episode(0).record
    assert rec.stop_reason == "key"
    assert rec.success is True
    assert rec.num_steps == rec.chunks["chunk_start"][1]


def test_intervention_actions_are_recorded_as_human(runners):
    """While a human takes over, the env gets the human action and the step is marked human."""
    events = EventBus()
    takeover = np.array([0.5, -0.25], np.float32)

    class Takeover(StopPredicate):
        def check(self, view):
            events.intervene(takeover if view.chunk == 1 else None)
            return None

    env = ActionLog(make_env())
    host = RolloutHost(env, *runners, HostConfig(seed=2, max_chunks=3), predicates=[Takeover()], events=events)
    rec = host.run_episode(0).record
    s = rec.chunks["chunk_start"]
    actors = rec.steps["actor"]
    assert (actors[: s[1]] == ACTOR_POLICY).all()
    assert (actors[s[1] : s[2]] == ACTOR_HUMAN).all()
    np.testing.assert_array_equal(rec.steps["actions"][s[1] : s[2]], np.tile(takeover, (s[2] - s[1], 1)))
    np.testing.assert_array_equal(np.stack(env.received), rec.steps["actions"])


def test_nonfinite_policy_output_never_reaches_env():
    """A policy emitting NaN stops the episode at that boundary with nothing executed."""
    p, c = make_runners(4)
    with torch.no_grad():
        p.model.expert.out.bias.fill_(float("nan"))
    env = ActionLog(make_env())
    rec = RolloutHost(env, p, c, HostConfig(seed=0)).run_episode(0).record
    assert rec.stop_reason == "nonfinite_action"
    assert env.received == []
    assert rec.num_steps == 0 and rec.num_chunks == 1


def test_same_seed_same_record_in_a_fresh_host():
    """Two hosts with fresh runners produce byte-identical episodes for the same run seed."""
    a = RolloutHost(make_env(), *make_runners(5), HostConfig(seed=9, max_chunks=3)).run_episode(2).record
    b = RolloutHost(make_env(), *make_runners(5), HostConfig(seed=9, max_chunks=3)).run_episode(2).record
    for k, v in a.steps.items():
        assert v.tobytes() == b.steps[k].tobytes(), k
    for k, v in _strip_timing(a).items():
        assert v.tobytes() == _strip_timing(b)[k].tobytes(), k
    for k, v in a.initial_state.items():
        assert v.tobytes() == b.initial_state[k].tobytes(), k


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"critic_threshold": 0.5}, "critic_threshold"),
        ({"critic_threshold": float("nan")}, "critic_threshold"),
        ({"critic_patience": 0}, "critic_patience"),
        ({"max_seconds": float("nan")}, "max_seconds"),
        ({"max_chunks": "ten"}, "max_chunks"),
        ({"seed": -1}, "seed"),
        ({"execute_steps": 0}, "execute_steps"),
    ],
)
def test_bad_config_is_refused_naming_the_field(kw, field):
    """Out-of-range or mistyped config values raise ConfigError naming the field (the CLI maps it to its flag)."""
    with pytest.raises(ConfigError, match=f"^{field}: ") as info:
        HostConfig(**kw)
    assert info.value.field == field


def test_mid_episode_capsule_of_policy_critic_and_sim_replays_the_future(runners):
    """Snapshot policy, critic and MuJoCo state mid-episode; dirty all three; restore; the future is byte-identical."""
    from rollcap.capsule.verbs import restore, snapshot
    from rollcap.rollout.seeding import chunk_noise

    policy, critic = runners
    env = make_env()
    obs, _ = env.reset(seed=5)
    for _ in range(3):
        obs, *_ = env.step(np.array([0.3, -0.2], np.float32))
    comps = {"policy": policy, "critic": critic, "env": env}
    cap = snapshot(comps, label="mid-episode")
    saved_obs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in obs.items()}

    def future(obs):
        out = []
        for k in range(3):
            chunk = policy.act(obs, chunk_noise(5, k, policy.noise_shape[1:]))
            value = critic.value(obs)
            for a in chunk:
                obs, r, *_ = env.step(a)
                out.append((chunk.tobytes(), value, obs["state"].tobytes(), obs["image_front"].tobytes(), r))
        return out

    first = future(obs)
    before = capture_count()
    restore(cap, comps)
    assert future(saved_obs) == first
    assert capture_count() == before
