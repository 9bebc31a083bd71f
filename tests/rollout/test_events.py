"""The event bus driving a real host: pause holds every step and launch, end, discard, quit, hand-back."""

from __future__ import annotations

import threading
import time

import numpy as np

from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import ACTOR_HUMAN, ACTOR_POLICY
from rollcap.rollout.events import EventBus
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import Subscriber
from tests.rollout._tiny import make_env


class At(Subscriber):
    """Calls ``fn(step)`` after each env step and records when steps and chunks happened."""

    def __init__(self, fn):
        self.fn, self.step_times, self.chunk_times = fn, [], []

    def on_chunk(self, chunk):
        self.chunk_times.append(time.perf_counter())

    def on_step(self, step):
        self.step_times.append(time.perf_counter())
        self.fn(step.step)


def test_pause_holds_steps_and_launches_until_resumed(runners):
    """Paused after step 2 for 0.3 s: no step or chunk happens meanwhile; the episode then goes on unchanged."""
    bus = EventBus()
    paused_at = []

    def act(step):
        if step == 2:
            bus.pause(True)
            paused_at.append(time.perf_counter())
            threading.Timer(0.3, bus.pause, args=(False,)).start()

    sub = At(act)
    host = RolloutHost(make_env(), *runners, HostConfig(seed=4, max_chunks=2), [sub], events=bus)
    rec = host.run_episode(0).record
    gap = sub.step_times[3] - sub.step_times[2]
    assert gap >= 0.28, gap
    assert not [t for t in (*sub.step_times, *sub.chunk_times) if paused_at[0] < t < paused_at[0] + 0.28]
    plain = RolloutHost(make_env(), *runners, HostConfig(seed=4, max_chunks=2)).run_episode(0).record
    assert rec.steps["actions"].tobytes() == plain.steps["actions"].tobytes()


def test_end_stops_at_the_next_step_and_nothing_more_is_launched(runners):
    """request_stop('keyboard') after step 1: the episode ends before step 2 with that reason, and no chunk follows."""
    bus = EventBus()
    sub = At(lambda step: bus.request_stop("keyboard") if step == 1 else None)
    end = RolloutHost(make_env(), *runners, HostConfig(seed=1), [sub], events=bus).run_episode(0)
    assert end.stop_reason == "keyboard" and end.num_steps == 2 and end.num_chunks == 1


def test_discard_drops_the_episode_and_quit_is_seen_between_episodes(runners, tmp_path):
    """discard(): no record reaches the recorder; quit() is readable by the driver; the next episode is recorded."""
    from rollcap.rollout.recording import EpisodeRecorder, load_any

    bus = EventBus()
    rec = EpisodeRecorder(tmp_path / "r")
    sub = At(lambda step: bus.discard() if step == 3 else None)
    host = RolloutHost(make_env(), *runners, HostConfig(seed=1, max_chunks=2), [sub, rec], events=bus)
    end = host.run_episode(0)
    assert end.dropped and end.stop_reason == "discarded" and end.record is None
    sub.fn = lambda step: None
    bus.quit()
    host.run_episode(1)
    assert bus.quit_requested and host.state is HostState.RESET
    rec.close()
    assert [r.index for r in load_any(tmp_path / "r")] == [1]


HUMAN = np.array([0.4, -0.4], np.float32)


def takeover(bus: EventBus, after: int, until: int) -> At:
    """A subscriber that takes over after step ``after`` and hands back after step ``until``."""

    def act(step):
        if step == after:
            bus.intervene(HUMAN)
        elif step == until:
            bus.intervene(None)

    return At(act)


def test_hand_back_replans_from_the_current_observation(runners):
    """A human takes steps 1-2; when they let go, a new chunk starts at step 3 (the old plan is dropped)."""
    bus = EventBus()
    human = HUMAN
    host = RolloutHost(make_env(), *runners, HostConfig(seed=2, max_chunks=3), [takeover(bus, 0, 2)], events=bus)
    rec = host.run_episode(0).record
    assert list(rec.steps["actor"][:4]) == [ACTOR_POLICY, ACTOR_HUMAN, ACTOR_HUMAN, ACTOR_POLICY]
    assert int(rec.chunks["chunk_start"][1]) == 3
    np.testing.assert_array_equal(rec.steps["actions"][1:3], np.tile(human, (2, 1)))


def test_wait_for_go_is_released_by_go_or_quit():
    """A teleop reset waits for go(); quit() releases it too; a timeout returns False."""
    bus = EventBus()
    assert not bus.wait_for_go(timeout=0.01)
    threading.Timer(0.05, bus.go).start()
    assert bus.wait_for_go(timeout=2)
    bus.quit()
    assert bus.wait_for_go(timeout=0.01) and bus.quit_requested


def test_intervened_steps_keep_the_policy_s_would_be_action(runners):
    """record.intervention marks the human steps; record.policy_actions() gives the planned action at every step."""
    bus = EventBus()
    rec = (
        RolloutHost(make_env(), *runners, HostConfig(seed=2, max_chunks=4), [takeover(bus, 0, 6)], events=bus)
        .run_episode(0)
        .record
    )
    assert rec.intervention.tolist()[:8] == [False, True, True, True, True, True, True, False]
    planned = rec.policy_actions()
    assert planned.shape == rec.steps["actions"].shape
    policy_steps = ~rec.intervention
    np.testing.assert_array_equal(planned[policy_steps], rec.steps["actions"][policy_steps])
    assert not np.array_equal(planned[1:7], rec.steps["actions"][1:7])
