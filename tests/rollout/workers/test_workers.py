"""Env workers: an episode is the same bytes wherever its env lived; a killed worker loses and duplicates nothing.

Real worker processes (spawned), real shared memory, real SIGKILLs; the tiny models of ``tests/rollout/_tiny.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import rollcap
from rollcap.critics import save_critic
from rollcap.policies import save_policy
from rollcap.rollout.api import Interrupted
from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.spec import Parts, RunConfig, Spec, auto_env_workers, usable_cores
from rollcap.rollout.build import make_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.offline.replay import Replayer
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.recording import episode_digest, load_any
from rollcap.rollout.recording.shards import ManifestWriter, read_manifest
from rollcap.rollout.workers import EnvWorkers
from tests.rollout._tiny import ENV_KW
from tests.rollout.test_batch import _batched, _models
from tests.rollout.workers._faulty import ENV_ID as FAULTY
from tests.rollout.workers._probe import ENV_ID as PROBE
from tests.rollout.workers._faulty import watching

PUSH = "rollcap/PushBlock-v0"
CONFIG = HostConfig(seed=7, max_chunks=6)


def _in_process(n: int, todo, env_id: str = PUSH, kw: dict = ENV_KW) -> dict[int, str]:
    policy, critic = _batched(n)
    core = BatchedCore([make_env(env_id, kw) for _ in range(n)], policy, critic, CONFIG)
    try:
        return {e.index: episode_digest(e.record) for e in core.episodes(todo)}
    finally:
        core.close()


def _meta(env_id: str = PUSH, kw: dict = ENV_KW) -> dict:
    return {"env_name": env_id, "type": 2, "env_kwargs": kw}


@pytest.mark.slow(seconds=40)
def test_an_episode_is_the_same_bytes_wherever_its_env_lived(tmp_path):
    """At batch 4: the in-process core, 1, 2 and 3 workers (another split of the slots) give every episode the same digest,
    and what each worker wrote to its shard reads back as one run with those digests."""
    want = _in_process(4, range(7))
    for workers in (1, 2, 3):
        policy, critic = _batched(4)
        pool = EnvWorkers(PUSH, ENV_KW, policy, critic, CONFIG, workers)
        manifest = ManifestWriter(tmp_path / f"w{workers}", ("npz", "h5"), _meta())
        try:
            pool.record_to(manifest, _meta())
            ends = list(pool.episodes(range(7)))
        finally:
            pool.close()
            manifest.close()
        assert sorted(e.index for e in ends) == list(range(7)) and pool.digests == want, workers
        assert {i: episode_digest(r) for i, r in enumerate(load_any(tmp_path / f"w{workers}"))} == want
        assert len({e.shard for e in read_manifest(tmp_path / f"w{workers}")[1].values()}) == workers


@pytest.mark.slow(seconds=15)
def test_a_worker_imports_no_torch(tmp_path):
    """A worker that has started, stepped, recorded (npz and HDF5) and finished episodes holds no torch module (the
    env of each slot writes its process's torch modules at every reset), and its start says so too; this process has
    torch (the runners)."""
    import sys

    kw = {**ENV_KW, "modules_to": str(tmp_path / "modules")}
    policy, critic = _batched(2)
    pool = EnvWorkers(PROBE, kw, policy, critic, CONFIG, 2)
    manifest = ManifestWriter(tmp_path / "run", ("npz", "h5"), _meta(PROBE, kw))
    try:
        pool.record_to(manifest, _meta(PROBE, kw))
        ends = list(pool.episodes(range(6)))
        starts = [p.start for p in pool.procs]
    finally:
        pool.close()
        manifest.close()
    assert "torch" in sys.modules and len(ends) == 6 and len(load_any(tmp_path / "run")) == 6
    seen = [json.loads(f.read_text()) for f in tmp_path.glob("modules.*")]
    assert sorted(s["pid"] for s in seen) == sorted(p.pid for p in pool.procs)
    assert all(s["resets"] >= 2 for s in seen) and [s["torch"] for s in seen] == [[], []], seen
    assert [s["torch"] for s in starts] == [False, False] and all(s["start_s"] > 0 and s["rss_mb"] > 0 for s in starts)


@pytest.mark.slow(seconds=20)
def test_graphs_run_their_rounds_side_by_side_with_the_same_bytes(tmp_path):
    """4 envs on 2 graphs at batch 2 over 2 workers (one a graph: each graph's round runs beside the other's) give the
    episodes of 2 envs on one graph at batch 2 in process, byte for byte."""
    want = _in_process(2, range(7))
    pairs = [_batched(2) for _ in range(2)]
    pool = EnvWorkers(PUSH, ENV_KW, [p for p, _ in pairs], [c for _, c in pairs], CONFIG, 2)
    manifest = ManifestWriter(tmp_path / "g", ("npz",), _meta())
    try:
        assert pool.groups == [[0], [1]] and [p.slots for p in pool.procs] == [[0, 1], [2, 3]]
        pool.record_to(manifest, _meta())
        ends = list(pool.episodes(range(7)))
    finally:
        pool.close()
        manifest.close()
    assert sorted(e.index for e in ends) == list(range(7)) and pool.digests == want


@pytest.mark.slow(seconds=60)
def test_run_with_env_workers_repeats_replays_and_matches_in_process(tmp_path):
    """``rollcap.run(envs=3, env_workers=2)`` twice gives the digests of ``envs=3`` in process; every episode replays exactly
    in all three modes (``rollcap replay``'s Replayer)."""
    p, c = _models(1)
    pol, cri = save_policy(p, tmp_path / "p"), save_critic(c, tmp_path / "c")
    kw = dict(env_kwargs=ENV_KW, policy=pol, critic=cri, envs=3, max_chunks=5, progress=False, formats=("npz",))
    digests = [
        [episode_digest(r) for r in rollcap.run(5, out=tmp_path / f"r{k}", env_workers=w, **kw).records()]
        for k, w in enumerate((2, 2, 0))
    ]
    assert digests[0] == digests[1] == digests[2] and len(digests[0]) == 5
    summary = rollcap.run(5, out=tmp_path / "r3", env_workers=3, **kw).summary
    assert summary["env_workers"] == 3 and summary["episodes"] == 5 and summary["worker_restarts"] == 0
    replayer = Replayer(Parts(env_kwargs=ENV_KW, policy=pol, critic=cri))
    try:
        results = [
            res for rec in load_any(tmp_path / "r0") for res in replayer.check("run", rec, ("policy", "env", "closed"))
        ]
    finally:
        replayer.close()
    assert len(results) == 15 and all(r.status == "exact" for r in results), [r.line() for r in results]


@pytest.mark.slow(seconds=60)
def test_a_killed_worker_ends_only_its_episodes_which_run_again(tmp_path):
    """SIGKILL of a worker mid-chunk: its slots' episodes end (stop reason worker_lost, the worker named) and run again on the
    others or a replacement; the run holds every episode once, each the bytes of an in-process run. An env that raises
    ends only its own episode (recorded, stop reason error)."""
    slow = {**ENV_KW, "step_s": 0.01}  # a chunk of 4 steps takes 40 ms: long enough to be caught in
    want = _in_process(4, range(10), FAULTY, slow)
    policy, critic = _batched(4)
    pool = EnvWorkers(FAULTY, slow, policy, critic, CONFIG, 2)
    manifest = ManifestWriter(tmp_path / "run", ("npz", "h5"), _meta(FAULTY, slow))
    killed = None

    def kill_mid_chunk(done) -> None:
        """Kill worker 0 while it steps a chunk: told to go on, its reply not back (the ends alone came too seldom on a
        busy machine to catch it between them)."""
        nonlocal killed
        while killed is None and not done.is_set():
            victim = pool.procs[0]
            if victim.state == "launching" and victim.running and not victim.conn.poll():
                killed = (victim.pid, sorted(i for i, _ in victim.running.values()))
                os.kill(victim.pid, signal.SIGKILL)
            time.sleep(0.001)

    try:
        pool.record_to(manifest, _meta(FAULTY, slow))
        with watching(kill_mid_chunk):
            ends = list(pool.episodes(range(10)))
    finally:
        pool.close()
        manifest.close()
    assert killed is not None, "the worker was never caught mid-chunk"
    pid, running = killed
    assert sorted(e.index for e in ends) == list(range(10))  # each once: nothing lost, nothing twice
    lost = [e.index for e in pool.losses.lost]  # what it ran, and what was handed to it before its death was seen
    assert (
        set(running) <= set(lost)
        and len(set(lost)) == len(lost)
        and pool.losses.restarts == 1
        and not pool.losses.failed
    )
    assert all(
        e.stop_reason == "worker_lost" and f"env worker 0 (pid {pid})" in e.error and "SIGKILL" in e.error
        for e in pool.losses.lost
    )
    faulty = next(e for e in ends if e.index == 1)
    assert faulty.stop_reason == "error" and "motor driver fault" in faulty.error
    assert pool.digests == want
    assert {r.index: episode_digest(r) for r in load_any(tmp_path / "run")} == want


class _CtrlC(Subscriber):
    """Sends this process SIGINT (a Ctrl-C) once ``after`` episodes have ended."""

    def __init__(self, after: int):
        self.after, self.seen = after, 0

    def on_episode_end(self, end) -> None:
        self.seen += 1
        if self.seen == self.after:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow(seconds=10)
def test_ctrl_c_leaves_a_resumable_run_and_the_worker_count_never_changes_bytes(tmp_path):
    """A Ctrl-C during a run on 2 workers keeps the finished episodes; resumed on 1 worker the run holds the digests of an
    uninterrupted in-process run; a resume at another batch is refused in one line naming envs."""
    p, c = _models(2)
    pol, cri = save_policy(p, tmp_path / "p"), save_critic(c, tmp_path / "c")
    kw = dict(env_kwargs=ENV_KW, policy=pol, critic=cri, max_chunks=5, progress=False, formats=("npz", "h5"))
    # A worker's episode reaches the parent once it is on disk, so under load the parent can learn of the first ends
    # after the workers have stepped many more: 24 episodes keep the Ctrl-C inside the run (8 did not, on a busy CI box).
    n = 24
    want = [episode_digest(r) for r in rollcap.run(n, out=tmp_path / "plain", envs=4, **kw).records()]
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as stop:
        rollcap.run(n, out=tmp_path / "r", envs=4, env_workers=2, subscribers=(_CtrlC(2),), **kw)
    # Not a speed goal: a hang guard. The Ctrl-C lands in a subscriber, mid-way through a worker's reply; the reply's
    # state used to be dropped and the abort waited 60 s for a message already read (3 s here since).
    assert time.monotonic() - t0 < 30
    kept = stop.value.result.summary["episodes"]
    assert 2 <= kept < n
    with pytest.raises(ConfigError, match="batch 4") as refused:
        rollcap.run(n, out=tmp_path / "r", envs=2, env_workers=2, resume=True, **kw)
    assert refused.value.field == "envs" and "\n" not in str(refused.value)
    resumed = rollcap.run(n, out=tmp_path / "r", envs=4, env_workers=1, resume=True, **kw)
    assert resumed.summary["episodes"] == n
    assert [episode_digest(r) for r in load_any(tmp_path / "r")] == want


def test_refusals():
    """env_workers needs a batched run of at least as many envs, and no actors, writers or teleop (ConfigError naming it)."""
    for bad in (dict(env_workers=-1, envs=2), dict(env_workers=3, envs=2), dict(env_workers=1, envs=1),
                dict(env_workers=2, envs=2, writers=2), dict(env_workers=2, envs=2, actors=2)):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            rollcap.run(1, **bad)
        assert err.value.field == "env_workers", bad
    with pytest.raises(ConfigError, match="or auto, got 'many'"):
        rollcap.run(1, envs=2, env_workers="many")


def test_auto_is_a_core_each_less_two_a_multiple_of_graphs_and_none_where_workers_do_not_apply():
    """env_workers="auto": min(envs, cores - 2), rounded down to a multiple of graphs; 0 under 2 workers (a small box,
    where workers only take cores from the policy), with envs 1, and with actors, writers or teleop (they record
    otherwise). Settled where the run is built (the spec holds the word), so a run and its summary hold the number."""
    from rollcap.rollout.build import for_this_machine

    assert [auto_env_workers(32, 1, c) for c in (1, 2, 3, 4, 8, 16, 64)] == [0, 0, 0, 2, 6, 14, 32]
    assert (auto_env_workers(32, 2, 15), auto_env_workers(32, 4, 16), auto_env_workers(1, 1, 16)) == (12, 12, 0)

    def settled(**run) -> int | str:
        return for_this_machine(Spec(run=RunConfig(**run))).run.env_workers

    assert RunConfig(envs=8, env_workers="auto").env_workers == "auto"
    assert settled(envs=8, env_workers="auto") == auto_env_workers(8, 1, usable_cores())
    for other in (dict(writers=2), dict(actors=2), dict(teleop="terminal", envs=1)):
        assert settled(**{"envs": 8, **other, "env_workers": "auto"}) == 0


def test_auto_is_the_default_for_a_batched_run_and_says_what_a_subscriber_misses(monkeypatch):
    """A batched run's env_workers defaults to auto (0 here on 2 cores, with envs 1, with actors); on a 16-core machine
    rollcap.run warns that its subscribers will see no observations, naming env_workers=0 (before anything is built)."""
    import rollcap.rollout.spec as spec
    from rollcap.rollout.build import for_this_machine

    def settled(**run) -> int | str:
        return for_this_machine(Spec(run=RunConfig(**run))).run.env_workers

    assert RunConfig(envs=8).env_workers == "auto" and settled(envs=8) == auto_env_workers(8, 1, usable_cores())
    assert settled() == 0 and settled(envs=8, actors=2) == 0
    monkeypatch.setattr(spec, "usable_cores", lambda: 16)  # a GPU box's cores (this one has 2)
    assert settled(envs=4) == 4 and settled(envs=4, env_workers=0) == 0
    with pytest.warns(UserWarning, match="env_workers=0"), pytest.raises(ConfigError):
        rollcap.run(1, envs=4, subscribers=(Subscriber(),), out="/proc/rollcap-cannot-be-here")


def test_a_run_where_auto_chose_no_worker_names_the_count_in_its_summary(tmp_path):
    """env_workers="auto" that chooses none (envs 1: on any machine) leaves env_workers 0 in summary.json, as README
    says the summary names the worker count (the key was missing)."""
    p, c = _models(1)
    kw = dict(env_kwargs=ENV_KW, policy=save_policy(p, tmp_path / "p"), critic=save_critic(c, tmp_path / "c"))
    result = rollcap.run(1, out=tmp_path / "r", envs=1, env_workers="auto", max_chunks=2, progress=False, **kw)
    assert result.summary["env_workers"] == 0
