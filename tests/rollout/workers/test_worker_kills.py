"""Env workers killed at any moment: each death is one more restart, every episode is recorded once, in one shard, and
the exit code says whether the run finished.

Real ``rollcap run`` processes, real spawned workers, real ``kill -9`` (``os.kill(pid, SIGKILL)``) from outside, and
workers that kill themselves (``tests/rollout/workers/_faulty.py``); the tiny models of ``tests/rollout/_tiny.py``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import make_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.recording import episode_digest, load_any
from rollcap.rollout.recording.h5read import h5_indices
from rollcap.rollout.recording.shards import ManifestWriter, read_manifest
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.workers import EnvWorkers
from tests.rollout._tiny import ENV_KW
from tests.rollout.test_batch import _batched
from tests.rollout.workers._faulty import ENV_ID as FAULTY
from tests.rollout.workers._faulty import watching

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def _flags(ckpt: list[str], **env_kw) -> list[str]:
    """The checkpoints of ``ckpt`` on the faulty env with ``env_kw``."""
    return [*ckpt[:4], "--env", FAULTY, "--env-kwargs", json.dumps({**ENV_KW, **env_kw})]


def _start(out: Path, episodes: int, flags: list[str]) -> subprocess.Popen:
    cmd = [*ROLLCAP, "run", "--episodes", str(episodes), "--envs", "4", "--env-workers", "2", "--seed", "7"]
    cmd += ["--max-chunks", "6", "--no-progress", "--out", str(out), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _workers(proc: subprocess.Popen) -> list[int]:
    """The pids of ``proc``'s env worker processes (spawned children; not multiprocessing's resource tracker)."""
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    pids = []
    for pid in kids.read_text().split() if kids.exists() else []:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except OSError:
            pass
    return sorted(pids)


def _manifest(out: Path) -> list[dict]:
    try:
        lines = (out / "manifest.jsonl").read_text().splitlines()[1:]
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.endswith("}")]


def _wait(proc: subprocess.Popen, until, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = until()
        if got:
            return got
        assert proc.poll() is None, f"the run ended while waiting for {what}: {proc.communicate()}"
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def _copies(run: Path) -> tuple[collections.Counter, collections.Counter]:
    """How many times each episode index is in the shards: npz files, HDF5 demos (as committed)."""
    npz, h5 = collections.Counter(), collections.Counter()
    for shard in sorted((run / "shards").iterdir()):
        npz.update(int(p.stem.split("_")[1]) for p in (shard / "episodes").glob("episode_*.npz"))
        if (shard / "episodes.hdf5").exists():
            h5.update(h5_indices(shard / "episodes.hdf5"))
    return npz, h5


def _assert_once(run: Path, episodes: int) -> None:
    """Every episode once in the manifest, once among the shards' npz files and once among their HDF5 demos."""
    npz, h5 = _copies(run)
    want = collections.Counter(range(episodes))
    assert npz == want and h5 == want, (npz - want, h5 - want)
    assert sorted(read_manifest(run)[1]) == list(range(episodes))


@pytest.mark.slow(seconds=45)
def test_workers_killed_at_any_moment_are_replaced_and_the_run_finishes_with_every_episode_once(ckpt, tmp_path):
    """``kill -9`` of an original worker, of its replacement while it starts, of the next replacement after it recorded
    an episode, and of the last original worker: 4 restarts, the run exits 0 and prints its summary, summary.json names
    the 4 deaths and when each came, and each of the 40 episodes is in exactly one shard (npz and HDF5), its digest the
    manifest's."""
    n = 40
    flags = _flags(ckpt, step_s=0.02)  # an episode of 24 steps: half a second, so 40 outlast 4 kills and restarts
    out = tmp_path / "run"
    proc = _start(out, n, flags)
    try:
        first = _wait(
            proc, lambda: len(_manifest(out)) >= 4 and len(w := _workers(proc)) == 2 and w, "the first episodes"
        )
        os.kill(first[0], signal.SIGKILL)  # an original worker, mid-run
        starting = _wait(proc, lambda: [p for p in _workers(proc) if p not in first], "its replacement")[0]
        os.kill(starting, signal.SIGKILL)  # the replacement, while it starts (spawn and imports take seconds)
        started = _wait(proc, lambda: [p for p in _workers(proc) if p not in (*first, starting)], "another")[0]
        shards = {e["shard"] for e in _manifest(out)}  # it is not ready yet: it has no shard
        _wait(proc, lambda: {e["shard"] for e in _manifest(out)} - shards, "an episode in its shard")
        os.kill(started, signal.SIGKILL)  # the replacement, after it started and recorded
        recorded = len(_manifest(out))
        _wait(proc, lambda: len(_manifest(out)) >= recorded + 2, "two more episodes")
        os.kill(first[1], signal.SIGKILL)  # the last original worker
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert "env workers      2, 4 restarted" in stdout and f"episodes         {n}" in stdout, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == n and summary["worker_restarts"] == 4 and not summary["failed"]
    deaths = {d["pid"]: d for d in summary["workers_lost"]}
    assert sorted(deaths) == sorted([*first, starting, started])
    assert deaths[starting]["when"] == "while starting" and deaths[started]["when"] != "while starting"
    assert all(d["how"] == "killed by SIGKILL" for d in deaths.values())
    again, kept = len(summary["lost_and_rerun"]), len(summary["kept_from_lost_workers"])
    assert again + kept and f"episodes of lost workers: {again} run again, {kept} kept as written" in stdout, stdout
    _assert_once(out, n)
    assert [r.index for r in load_any(out)] == list(range(n))  # each read from its shard, digest checked


@pytest.mark.slow(seconds=30)
def test_a_run_that_cannot_finish_says_so_in_one_line_and_exits_1(ckpt, tmp_path):
    """An episode whose env kills its worker every time is given up after 3 tries, alone (the episodes that shared its
    worker the first time run again, and never beside it): the run prints its summary, one line naming the episode and
    --resume, exits 1, and holds every other episode once."""
    doomed = 2
    proc = _start(tmp_path / "run", 10, _flags(ckpt, kill_seeds=[episode_seed(7, doomed)]))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "1 episode(s) failed on the env workers (2)" in lines[0] and "--resume" in lines[0], (
        stderr
    )
    assert "episodes         9" in stdout and "env workers      2, 3 restarted" in stdout, stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert list(summary["failed"]) == ["2"] and summary["episodes"] == 9
    npz, h5 = _copies(tmp_path / "run")
    assert npz == h5 == collections.Counter(i for i in range(10) if i != doomed)


@pytest.mark.slow(seconds=15)
def test_workers_that_die_before_they_are_ready_every_time_end_the_run_in_one_line():
    """A worker that dies while it starts is started again; one that dies 3 times in a row before it is ready ends the run:
    RecordingFailed naming the worker, the count and the signal (the CLI's exit 1)."""
    policy, critic = _batched(2)
    with pytest.raises(
        RecordingFailed, match=r"env worker \d could not start: it died 3 times before it was ready"
    ) as err:
        EnvWorkers(FAULTY, {**ENV_KW, "die_at_start": True}, policy, critic, HostConfig(seed=7), 2)
    assert "(the last: killed by SIGKILL)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow(seconds=20)
def test_an_episode_a_dying_worker_wrote_whole_is_kept_not_run_again(tmp_path):
    """A worker killed after its writer put finished episodes on disk, before it told this process: they are named from
    its shard (not run again), summary says they were kept, and no episode is in two shards; the bytes are an in-process
    run's."""
    n, config = 8, HostConfig(seed=7, max_chunks=4)
    kw = {**ENV_KW, "stall_seeds": [episode_seed(7, i) for i in range(4, n)], "stall_s": 2.0}
    policy, critic = _batched(4)
    core = BatchedCore([make_env(FAULTY, kw) for _ in range(4)], policy, critic, config)
    try:
        want = {e.index: episode_digest(e.record) for e in core.episodes(range(n))}
    finally:
        core.close()
    meta = {"env_name": FAULTY, "type": 2, "env_kwargs": kw}
    pool = EnvWorkers(FAULTY, kw, policy, critic, config, 2)
    manifest = ManifestWriter(tmp_path / "run", ("npz", "h5"), meta)
    killed: list[tuple[int, list[int]]] = []

    def kill_once_written(done) -> None:
        """Kill the first worker whose finished episodes are all on disk (npz and HDF5) while it stalls in a reset."""
        while not killed and not done.is_set():
            for p in list(pool.procs):
                pending, shard = sorted(p.pending), p.shard
                if pending and shard and p.state == "launching":
                    root = tmp_path / "run" / shard
                    h5 = root / "episodes.hdf5"
                    npz = all((root / "episodes" / f"episode_{i:05d}.npz").exists() for i in pending)
                    if npz and h5.exists() and set(pending) <= set(h5_indices(h5)):
                        killed.append((p.pid, pending))
                        os.kill(p.pid, signal.SIGKILL)
                        return
            time.sleep(0.005)

    try:
        pool.record_to(manifest, meta)
        with watching(kill_once_written):
            ends = list(pool.episodes(range(n)))
    finally:
        pool.close()
        manifest.close()
    assert killed, "no worker was caught with written, unreported episodes"
    pid, written = killed[0]
    assert sorted(e.index for e in ends) == list(range(n)) and pool.losses.restarts == 1
    assert [k["index"] for k in pool.losses.kept] == written and all(
        f"(pid {pid})" in k["note"] for k in pool.losses.kept
    )
    assert not set(written) & {e.index for e in pool.losses.lost}
    assert pool.summary()["kept_from_lost_workers"] == pool.losses.kept
    _assert_once(tmp_path / "run", n)
    assert {r.index: episode_digest(r) for r in load_any(tmp_path / "run")} == want == pool.digests
