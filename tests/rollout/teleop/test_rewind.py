"""Rewind in a live episode: the rewound episode and its retry are both recorded and each replays exactly."""

from __future__ import annotations

import pytest

from rollcap.envs import physics_row
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.offline.replay import closed_loop_host, replay_closed, replay_env
from rollcap.rollout.teleop.rewind import REWIND, RewindBuffer, run_with_rewinds
from tests.rollout._tiny import make_env


class _Operator(Subscriber):
    """Presses rewind once, mid-chunk, after step ``at`` (as a key would, through the buffer)."""

    def __init__(self, buffer, at: int, back: int):
        self.buffer, self.at, self.back, self.done = buffer, at, back, False

    def on_step(self, step):
        if not self.done and step.step == self.at:
            self.done = True
            self.buffer.request(self.back)


def test_a_live_rewind_then_the_retry_replay_exactly(runners):
    """Rewind mid-chunk 2 to chunk 1: the rewound episode stops 'rewind', the retry starts at chunk 1's state, both replay exactly."""
    p, c = runners
    host = RolloutHost(make_env(), p, c, HostConfig(seed=11, max_chunks=7))
    buffer = RewindBuffer.on(host, max_boundaries=3)
    host.subscribers.append(_Operator(buffer, at=9, back=1))  # chunk 2 covers steps 8..11 (execute_steps 4)
    ends = run_with_rewinds(host, buffer, 0)
    rewound, retry = (e.record for e in ends)
    assert rewound.stop_reason == REWIND and rewound.num_steps == 10 and len(ends) == 2
    assert retry.index == 1 and retry.origin["rewind"] == 1 and retry.origin["chunk"] == 1 and retry.origin["step"] == 4
    assert (
        retry.stop_reason == "timeout_chunks" and retry.num_chunks == 7
    )  # boundaries 1..7: the budget counts the kept prefix
    assert physics_row(retry.initial_state).tobytes() == rewound.steps["states"][4].tobytes()
    assert retry.steps["actions"][:4].tobytes() != rewound.steps["actions"][4:8].tobytes()  # new noise
    env = make_env()
    for rec in (rewound, retry):
        assert replay_env(rec, env).exact
        res = replay_closed(rec, closed_loop_host(rec, make_env(), p, c))
        assert res.exact, res.line()
    buffer.close()


def test_the_buffer_is_bounded(runners):
    """Only the last max_boundaries boundaries are kept, and a byte budget smaller than one capsule keeps none."""
    p, c = runners
    host = RolloutHost(make_env(), p, c, HostConfig(seed=2, max_chunks=5))
    buffer = RewindBuffer.on(host, max_boundaries=2)
    host.run_episode(0)
    assert buffer.kept == [4, 5]  # boundaries 0..5, the last one stopped
    with pytest.raises(ValueError, match="2 boundaries kept"):
        buffer.resume(2)
    tiny = RewindBuffer.on(RolloutHost(make_env(), p, c, HostConfig(seed=2, max_chunks=3)), budget_bytes=64)
    tiny.host.run_episode(0)
    assert tiny.kept == [] and tiny.registry.stats().drops == 4
    assert buffer.resume(0).chunk == 5 and buffer.resume(1).chunk == 4


@pytest.mark.slow
def test_rewind_key_in_a_teleop_run_then_replay(ckpt, tmp_path):
    """rollcap run --teleop: the rewind key mid-chunk 2 keeps episode 0 (stop 'rewind') and, after go, records the retry
    from chunk 1 under the next free index; both replay exactly in a fresh process."""
    import subprocess
    import sys

    from rollcap.rollout.recording import load_any

    keys = tmp_path / "keys.txt"
    keys.write_text("step=9 b\n0.05 g\nstep=3 q\n")
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "rollcap.rollout.cli"]
    args = [
        "run",
        "--episodes",
        2,
        "--max-chunks",
        6,
        "--out",
        out,
        "--teleop",
        f"scripted:{keys}",
        "--no-progress",
        *ckpt,
    ]
    res = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    recs = load_any(out)
    assert [r.index for r in recs] == [0, 2] == [r.index for r in load_any(out / "episodes.hdf5")]
    rewound, retry = recs
    assert rewound.stop_reason == "rewind" and rewound.num_steps == 9
    assert retry.origin["episode"] == 0 and retry.origin["chunk"] == 1 and retry.origin["rewind"] == 1
    res = subprocess.run([*cmd, "replay", str(out), *ckpt], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "-- all exact" in res.stdout, res.stdout + res.stderr[-2000:]
