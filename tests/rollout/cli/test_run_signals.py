"""A signal that lands after the last episode ran (while the writer drains) is noted, never raised into the drain.

CI caught `rollcap run` hanging after a Ctrl-C that arrived while the last
episodes were still being written: the KeyboardInterrupt left the teardown
half-done, the writer thread was still inside h5py when the process exited,
and exit-time clean-up blocked on the lock that thread held (no summary.json,
a hot journal left behind). These tests send the signal from inside the
teardown, in-process, so the moment is exact rather than a matter of timing.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

import rollcap
from rollcap.rollout.api import Interrupted
from rollcap.rollout.recording import load_any
from rollcap.rollout.protocols import Subscriber
from tests.rollout._tiny import make_env, make_runners


class SignalAtRunEnd(Subscriber):
    """Sends this process ``sig`` from ``on_run_end`` (called in the run's teardown, after the writer drained)."""

    def __init__(self, sig: int, times: int = 1):
        self.sig, self.times = sig, times

    def on_run_end(self) -> None:
        for _ in range(self.times):
            os.kill(os.getpid(), self.sig)


class SignalAtLastEpisode(Subscriber):
    """Sends SIGINT when episode ``last`` ends: the writer still has it queued, so the drain runs after the signal."""

    def __init__(self, last: int):
        self.last = last

    def on_episode_end(self, end) -> None:
        if end.index == self.last:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def parts():
    signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # Python's own, whatever ran before (conftest restores it after)
    env = make_env()
    policy, critic = make_runners()
    yield env, policy, critic
    for part in (env, policy, critic):
        part.close()


def _run(parts, out, subscriber):
    env, policy, critic = parts
    return rollcap.run(
        3,
        out=out,
        env=env,
        policy=policy,
        critic=critic,
        subscribers=(subscriber,),
        progress=False,
        max_chunks=3,
        seed=5,
    )


@pytest.mark.parametrize("times", [1, 2])
def test_signal_in_teardown_keeps_every_episode_and_the_summary(parts, tmp_path, times):
    """Ctrl-C (once, or twice) during the teardown: Interrupted, all 3 episodes in both formats, summary written, no journal."""
    with pytest.raises(Interrupted) as stop:
        _run(parts, tmp_path / "run", SignalAtRunEnd(signal.SIGINT, times))
    out = tmp_path / "run"
    assert stop.value.result.summary["episodes"] == 3
    assert json.loads((out / "summary.json").read_text())["episodes"] == 3
    assert (
        [r.index for r in load_any(out / "episodes")] == [r.index for r in load_any(out / "episodes.hdf5")] == [0, 1, 2]
    )
    assert not [p for p in out.rglob("*") if p.name.endswith(("-journal", ".tmp"))]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handler is back


def test_signal_during_last_episode_stops_cleanly(parts, tmp_path):
    """SIGINT as the last episode ends: the run stops as interrupted, whatever finished is whole in both formats."""
    with pytest.raises(Interrupted) as stop:
        _run(parts, tmp_path / "run", SignalAtLastEpisode(2))
    out = tmp_path / "run"
    kept = [r.index for r in load_any(out / "episodes")]
    assert kept == [r.index for r in load_any(out / "episodes.hdf5")] and kept[:2] == [0, 1]
    assert stop.value.result.summary["interrupted"] is True
    assert not [p for p in out.rglob("*") if p.name.endswith(("-journal", ".tmp"))]
