"""Ray batch rollouts: 0, 1 or 2 actors record the same episodes; a killed actor's episode runs again; loopback only; Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rollcap
from rollcap.rollout.config import HostConfig
from rollcap.rollout.spec import Parts
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.recording import EpisodeRecorder, episode_digest, h5_indices
from rollcap.rollout.recording.shards import ManifestWriter, is_sharded, merge, read_manifest
from rollcap.rollout.ray.actors import ActorPool, batch_rollout
from rollcap.rollout.ray.episodes import RolloutActor, emit, episode_specs
from rollcap.rollout.ray.replay import ReplayActor
from rollcap.rollout.subscribers import Metrics
from tests.rollout._tiny import ENV_KW

pytestmark = (
    pytest.mark.slow
)  # subprocesses, Ray or trained examples: the fast tier (-m "not slow") leaves them to the full suite

EPISODES = 16
CFG = {"seed": 11, "max_chunks": 6}


@pytest.fixture(scope="module")
def parts(ckpt) -> Parts:
    """The tiny checkpoints of the ``ckpt`` fixture as Parts."""
    return Parts(
        env_kwargs=ENV_KW, policy=Path(ckpt[ckpt.index("--policy") + 1]), critic=Path(ckpt[ckpt.index("--critic") + 1])
    )


@pytest.fixture(scope="module")
def local(parts, tmp_path_factory):
    """The 16 episodes run in this process without Ray: (run result, digests by index)."""
    result = _run(parts, tmp_path_factory.mktemp("local") / "run")
    return result, _digests(result.run_dir)


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (127.0.0.1 only) for the module; runs in it reuse it."""
    ray = pytest.importorskip("ray")
    from rollcap.rollout.ray.connect import connect

    assert connect(num_cpus=2)
    yield ray
    ray.shutdown()


def _run(parts: Parts, out: Path, **kw):
    return rollcap.run(
        EPISODES,
        out=out,
        env=parts.env_id,
        policy=parts.policy,
        critic=parts.critic,
        env_kwargs=parts.env_kwargs,
        progress=False,
        **CFG,
        **kw,
    )


def _committed(run_dir: Path) -> int:
    """Episodes the run's manifest names (0 before it exists or while it is being started)."""
    try:
        return len(read_manifest(run_dir)[1])
    except (FileNotFoundError, IndexError, ValueError):
        return 0


def _digests(run_dir) -> dict[int, str]:
    return {r.index: episode_digest(r) for r in rollcap.load(run_dir)}


def _once_in_both_formats(run_dir: Path, n: int) -> None:
    """Episodes 0..n-1 recorded once each, in both formats, which agree (a sharded run: in its shards, as its manifest says)."""
    if is_sharded(run_dir):
        with ManifestWriter(run_dir, resume=True) as m:
            assert [r.index for r in m.verify()] == list(
                range(n)
            )  # every format of every shard read back, digests checked against the manifest
        return
    npz = sorted(p.name for p in (run_dir / "episodes").glob("*.npz"))
    assert npz == [f"episode_{i:05d}.npz" for i in range(n)]
    assert h5_indices(run_dir / "episodes.hdf5") == list(range(n))
    with EpisodeRecorder(run_dir, resume=True) as rec:
        assert [r.index for r in rec.verify()] == list(range(n))  # both formats read back, digests checked, and agree


def _actor_pids() -> list[int]:
    import psutil  # Ray ships it (importable once ray is imported)

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "RolloutActor" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def _non_loopback_listeners() -> list[str]:
    """Sockets of this process and its descendants (the local Ray, its actors) bound to something other than loopback."""
    import ipaddress
    import socket

    import psutil

    me = psutil.Process()
    pids = {me.pid, *(p.pid for p in me.children(recursive=True))}
    bad = []
    for c in psutil.net_connections("inet"):  # TCP listeners and bound UDP sockets
        if c.pid not in pids or not c.laddr or (c.type == socket.SOCK_STREAM and c.status != psutil.CONN_LISTEN):
            continue
        ip = ipaddress.ip_address(c.laddr.ip.split("%")[0])
        ip = ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
        if not ip.is_loopback:
            bad.append(f"{c.laddr.ip}:{c.laddr.port} ({psutil.Process(c.pid).name()})")
    return bad


class _Probe(rollcap.Subscriber):
    """On the first episode end: note the listening sockets of every Ray process (actors included), and maybe kill an actor."""

    def __init__(self, kill: bool = False):
        self.kill, self.bad, self.killed, self.seen = kill, None, None, 0
        self.old = set(_actor_pids())  # an earlier run's actors may still be exiting

    def on_episode_end(self, end) -> None:
        self.seen += 1
        if self.seen == 1:
            self.bad = _non_loopback_listeners()
            if self.kill:
                self.killed = next(pid for pid in _actor_pids() if pid not in self.old)
                os.kill(self.killed, signal.SIGKILL)


# ------------------------------------------------------------ without Ray
def test_the_actor_class_runs_episodes_without_ray(parts, local):
    """RolloutActor is a plain class: its records are the local run's, in any order, and replay into the same metrics."""
    actor = RolloutActor(parts, HostConfig(**CFG))
    try:
        records = [actor.run(spec.index, spec.seed) for spec in episode_specs([5, 2], HostConfig(**CFG))]
    finally:
        actor.close()
    assert [episode_digest(r) for r in records] == [local[1][5], local[1][2]]
    ends = [emit(r, [m := Metrics()]) for r in records[:1]]
    want = [row for row in local[0].records() if row.index == 5]
    assert m.episodes == [Metrics.row(want[0])] and ends[0].record is records[0]
    assert len(m.boundary_s) == records[0].num_chunks


def test_objects_instead_of_names_are_refused_with_actors(parts):
    """Actors build their own parts: an env object is refused naming actors, before anything is built."""
    env = __import__("tests.rollout._tiny", fromlist=["make_env"]).make_env()
    try:
        with pytest.raises(ConfigError) as info:
            rollcap.run(2, env=env, actors=2)
    finally:
        env.close()
    assert info.value.field == "actors"
    with pytest.raises(ConfigError, match="needs actors") as info:
        rollcap.run(2, address="auto")
    assert info.value.field == "address"


def test_the_recorder_takes_episodes_in_any_index_order(tmp_path):
    """Actors finish out of order: the recorder writes indices as they come, and reads back and resumes by index."""
    from rollcap.rollout.recording import synthetic_record

    with EpisodeRecorder(tmp_path) as rec:
        for i in (5, 2, 9, 0):
            rec.write(synthetic_record(index=i, seed=i, steps=6, image_size=8))
    with EpisodeRecorder(tmp_path, resume=True) as rec:
        assert [r.index for r in rec.verify()] == [0, 2, 5, 9]
    assert h5_indices(tmp_path / "episodes.hdf5") == [0, 2, 5, 9]


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"actors": -1}, "actors"),
        ({"actors": 1.5}, "actors"),
        ({"address": "auto"}, "address"),
        ({"actors": 2, "actor_cpus": 0}, "actor_cpus"),
        ({"actors": 2, "actor_gpus": float("nan")}, "actor_gpus"),
    ],
)
def test_bad_actor_options_name_their_field(bad, field):
    """RunConfig refuses a bad actor option naming it (the CLI maps the field to its flag)."""
    from rollcap.rollout.spec import RunConfig

    with pytest.raises(ConfigError) as info:
        RunConfig(**bad)
    assert info.value.field == field


def test_without_ray_the_error_names_the_extra(parts, monkeypatch, tmp_path):
    """No ray installed: one ConfigError naming actors and the extra, before the run directory exists."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rollcap\[ray\]'") as info:
        _run(parts, tmp_path / "run", actors=2)
    assert info.value.field == "actors" and not (tmp_path / "run").exists()


def test_actors_get_absolute_checkpoint_paths_and_their_own_shipped_checkpoints(monkeypatch, tmp_path):
    """A relative path is made absolute for actors elsewhere; the shipped checkpoints are named, each node loads its own copy."""
    from rollcap.rollout.ray.actors import _portable

    assert _portable(Parts())[1] == ("policy", "critic")
    monkeypatch.chdir(tmp_path)
    portable, shipped = _portable(Parts(policy=Path("p.json"), critic="none"))
    assert (portable.policy, portable.critic, shipped) == (tmp_path / "p.json", None, ())


# --------------------------------------------------------------- with Ray
def test_one_and_two_actors_record_the_local_run_s_episodes_listening_on_loopback_only(
    ray_local, parts, local, tmp_path
):
    """16 episodes on 1 and on 2 actors (sharded): per-episode digests equal the in-process run's; no Ray socket listens off loopback."""
    one = _run(parts, tmp_path / "one", actors=1)
    probe = _Probe()
    two = _run(parts, tmp_path / "two", actors=2, subscribers=(probe,))
    assert _digests(one.run_dir) == _digests(two.run_dir) == local[1]
    assert (one.summary["actors"], two.summary["actors"], two.summary["retries"], two.summary["failed"]) == (
        1,
        2,
        0,
        {},
    )
    assert two.summary["episodes"] == EPISODES and two.summary["stop_reasons"] == local[0].summary["stop_reasons"]
    assert (one.summary["shards"], two.summary["shards"]) == (1, 2) and is_sharded(two.run_dir)
    _once_in_both_formats(two.run_dir, EPISODES)
    assert probe.bad == []


@pytest.mark.slow
def test_sharded_and_unsharded_runs_on_2_and_3_actors_give_the_local_digests_and_merge_to_one_file(
    ray_local, parts, local, tmp_path
):
    """shards=False (the driver records) and sharded on 2 and 3 actors: the same digests; the manifest names each shard's episodes; merge gives one file."""
    driver = _run(parts, tmp_path / "driver", actors=2, shards=False)
    three = _run(parts, tmp_path / "three", actors=3, actor_cpus=0.5)
    assert not is_sharded(driver.run_dir) and "shards" not in driver.summary
    assert _digests(driver.run_dir) == _digests(three.run_dir) == local[1]
    entries = read_manifest(three.run_dir)[1]
    assert three.summary["shards"] == 3 and {e.shard for e in entries.values()} == {
        "shards/s000",
        "shards/s001",
        "shards/s002",
    }
    _once_in_both_formats(three.run_dir, EPISODES)
    assert merge(three.run_dir) == EPISODES
    _once_in_both_formats(three.run_dir, EPISODES)  # now the single-file layout
    assert _digests(three.run_dir) == local[1]


def test_a_killed_actor_s_episode_runs_again_and_every_episode_is_recorded_once(ray_local, parts, local, tmp_path):
    """A local run resumed on 2 actors (sharded), one SIGKILLed mid-run: its episode runs again; 16 episodes, once each, in both formats; the summary counts the retry."""
    rollcap.run(
        5,
        out=tmp_path / "kill",
        env=parts.env_id,
        policy=parts.policy,
        critic=parts.critic,
        env_kwargs=parts.env_kwargs,
        progress=False,
        **CFG,
    )
    probe = _Probe(kill=True)
    result = _run(parts, tmp_path / "kill", actors=2, subscribers=(probe,), resume=True)
    assert probe.killed is not None
    assert (
        sorted(e.index for e in result.episodes) == list(range(5, EPISODES)) and result.summary["episodes"] == EPISODES
    )
    assert result.summary["retries"] >= 1 and result.summary["actors_replaced"] >= 1 and result.summary["failed"] == {}
    _once_in_both_formats(result.run_dir, EPISODES)
    assert _digests(result.run_dir) == local[1]
    assert probe.killed not in _actor_pids()


class _Doomed(RolloutActor):
    """Episode 1 kills the process running it, every time."""

    def run(self, index, seed, config=None):
        if index == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run(index, seed, config)


def test_an_episode_that_keeps_killing_actors_is_reported_failed_after_bounded_tries(ray_local, parts, local):
    """Each try of episode 1 kills its actor: after max_tries it is failed, the others finish, nothing is duplicated."""
    result = batch_rollout(episode_specs(range(4), HostConfig(**CFG)), 2, parts=parts, max_tries=2, actor_cls=_Doomed)
    ends, summary = result.ends, result.summary
    assert ray_local.is_initialized()  # batch_rollout leaves a Ray it did not start running
    assert sorted(e.index for e in ends) == [0, 2, 3]
    assert {e.index: episode_digest(e.record) for e in ends} == {i: local[1][i] for i in (0, 2, 3)}
    assert list(summary["failed"]) == ["1"] and "Actor" in summary["failed"]["1"]
    assert (summary["retries"], summary["actors_replaced"]) == (1, 2)


def test_an_actor_that_cannot_build_its_parts_is_one_config_error(ray_local, parts, tmp_path):
    """A checkpoint the actors cannot read (say, missing on a node): ActorPool raises one ConfigError naming it, and leaves no actor."""
    bad = Parts(env_kwargs=ENV_KW, policy=tmp_path / "missing.json", critic=parts.critic)
    with pytest.raises(ConfigError, match="missing.json"):
        ActorPool(bad, HostConfig(**CFG), 1)
    deadline = time.monotonic() + 15
    while _actor_pids() and time.monotonic() < deadline:  # a killed worker takes a moment to exit
        time.sleep(0.2)
    assert _actor_pids() == []


def test_ctrl_c_on_the_driver_stops_the_actors_and_keeps_finished_episodes(ray_local, ckpt, tmp_path):
    """SIGINT to `rollcap run --actors 2` once episodes exist: exit 130, whole episodes only, the actors are gone."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rollcap.rollout.cli",
        "run",
        "--actors",
        "2",
        "--episodes",
        "400",
        "--out",
        str(out),
        "--no-progress",
        "--max-chunks",
        "6",
        *ckpt,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (
            _committed(out) < 3 and time.monotonic() < deadline and proc.poll() is None
        ):  # named in the manifest, not only written
            time.sleep(0.1)
        import psutil

        actors = [
            p.pid for p in psutil.Process(proc.pid).children(recursive=True) if "RolloutActor" in " ".join(p.cmdline())
        ]
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    kept = _digests(out)
    assert 3 <= len(kept) < 400
    with ManifestWriter(
        out, resume=True
    ) as m:  # shards repaired and checked; an episode written but never named is adopted
        assert set(kept) <= set(m.indices) and [r.index for r in m.verify()] == m.indices
    assert actors and not [
        p for p in actors if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


# ------------------------------------------------------- replay on actors
def _replay_cli(capsys, *argv) -> tuple[int, list[str]]:
    from rollcap.rollout.cli import main

    code = main(["replay", *argv])
    return code, capsys.readouterr().out.splitlines()


def test_replay_on_two_actors_prints_what_a_local_replay_prints(ray_local, ckpt, local, capsys):
    """`rollcap replay --actors 2`: the same lines in the same order as in this process, every episode exact, the actors named in the summary."""
    run_dir = str(local[0].run_dir)
    code0, here = _replay_cli(capsys, run_dir, *ckpt)
    code2, there = _replay_cli(capsys, run_dir, "--actors", "2", *ckpt)
    assert code0 == code2 == 0
    assert there[:-1] == here[:-1] and len(here) == EPISODES * 3 + 1
    assert there[-1].startswith(here[-1]) and "on 2 Ray actor(s)" in there[-1] and "0 retried" in there[-1]


def _dies_at_episode_3(marker: Path | None) -> type:
    """A ReplayActor whose check of episode 3 kills the process running it: once (the first try makes ``marker``), or every time (``marker`` None)."""

    class Dies(ReplayActor):  # defined here, so Ray ships the class (and ``marker``) by value
        def check(self, source, rec, modes, import_env=False):
            if rec.index == 3 and (marker is None or not marker.exists()):
                if marker is not None:
                    marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().check(source, rec, modes, import_env)

    return Dies


def test_a_replay_actor_killed_mid_episode_is_replaced_and_an_episode_that_keeps_killing_is_failed(
    ray_local, parts, local, tmp_path
):
    """Killed once: the episode is checked again and is exact. Killed every try: FAILED after max_tries, never exact; the rest still exact."""
    from rollcap.rollout.ray import replay as ray_replay
    from rollcap.rollout.offline.replay import summary_line
    from rollcap.rollout.recording import episodes_of

    items = [it for it in episodes_of(local[0].run_dir) if it[1].index < 6]
    for marker, tries in ((tmp_path / "died", 3), (None, 2)):
        summary: dict = {}
        batches = ray_replay.replay_on_actors(
            items, ("policy", "env"), parts, 2, max_tries=tries, summary=summary, actor_cls=_dies_at_episode_3(marker)
        )
        results = [r for batch in batches for r in batch]
        by = {(r.episode, r.mode): r.status for r in results}
        assert {k: v for k, v in by.items() if k[0] != 3} == {
            (i, m): "exact" for i in (0, 1, 2, 4, 5) for m in ("policy", "env")
        }
        assert summary["retries"] >= 1 and summary["actors_replaced"] >= 1
        if marker is not None:
            assert (tmp_path / "died").exists() and by[(3, "policy")] == by[(3, "env")] == "exact"
        else:
            assert by[(3, "all")] == "failed" and "2 tries" in next(r.error for r in results if r.episode == 3)
            assert summary_line(results)[1] is False


def test_bench_refuses_one_actor_before_measuring_anything(capsys):
    """`rollcap bench --actors 1`: the Ray section compares 1 actor with N >= 2; one line, exit 2, nothing run."""
    from rollcap.rollout.cli import main

    assert main(["bench", "--actors", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "rollcap bench: error: --actors: the Ray section compares 1 actor with N >= 2, got 1"


# ------------------------------------------------- start-up and lost actors
def _first_actor_only(marker: Path) -> type:
    """A RolloutActor that kills its process at episode 1 (making ``marker``); once ``marker`` exists no actor can start (no node for it)."""

    class FirstOnly(RolloutActor):  # defined here, so Ray ships the class (and ``marker``) by value
        def __init__(self, *args, **kw):
            if marker.exists():
                raise RuntimeError("no node for a replacement")
            super().__init__(*args, **kw)

        def run(self, index, seed, config=None):
            if index == 1:
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().run(index, seed, config)

    return FirstOnly


def test_with_no_live_actor_left_the_rest_fails_with_one_line(ray_local, parts, local, tmp_path, capfd):
    """The only actor dies and its replacement cannot start: it is dropped (one line), the items left fail (one line), nothing hangs."""
    result = batch_rollout(
        episode_specs(range(4), HostConfig(**CFG)), 1, parts=parts, actor_cls=_first_actor_only(tmp_path / "dead")
    )
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("rollcap:")]
    assert [e.index for e in result.ends] == [0] and episode_digest(result.ends[0].record) == local[1][0]
    assert result.summary["failed"] == {str(i): "no live actor left (1 dropped)" for i in (1, 2, 3)}
    assert result.summary["actors_dropped"] == 1 and len(err) == 3, err
    assert err[0].startswith("rollcap: lost an actor on ") and "(its actor died); episode 1 runs again" in err[0]
    assert err[1].startswith("rollcap: a replacement actor could not start (") and err[1].endswith(
        "going on with 0 actor(s)"
    )
    assert err[2] == "rollcap: no live actor left (1 dropped): 3 item(s) not run"


def test_an_address_nothing_answers_at_is_refused_before_anything_is_built(parts, monkeypatch, tmp_path):
    """--address is checked first: one ConfigError naming it, no env or model built, no run directory."""
    import socket

    import rollcap.rollout.build as build  # where every entry point makes its envs

    monkeypatch.setattr(
        build, "make_env", lambda *a, **k: pytest.fail("the env was built before the address was checked")
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=f"nothing answers at 127.0.0.1:{port}") as info:
        _run(parts, tmp_path / "run", actors=2, address=f"127.0.0.1:{port}")
    assert info.value.field == "address" and not (tmp_path / "run").exists()


def _ray_children(pid: int) -> set[str]:
    import psutil

    names = set()
    for p in psutil.Process(pid).children(recursive=True):
        try:
            names.add(p.name())
        except psutil.Error:
            pass
    return names & {"raylet", "gcs_server"}


@pytest.mark.parametrize("when", ["building", "actors starting"])
def test_ctrl_c_during_start_up_stops_at_once(ckpt, tmp_path, when):
    """SIGINT while the parts build: exit 130 before Ray starts. SIGINT while the actors build: exit 130 within seconds. One line, no traceback, no run dir."""
    import psutil

    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "rollcap.rollout.cli",
        "run",
        "--actors",
        "2",
        "--episodes",
        "4",
        "--out",
        str(out),
        "--no-progress",
        "--max-chunks",
        "6",
        *ckpt,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 120
        if when == "building":
            time.sleep(1.0)
        else:
            while not _ray_children(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                seen |= _ray_children(proc.pid)
            except psutil.Error:
                pass
            time.sleep(0.05)
        waited = time.monotonic() - sent
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted"
    assert not out.exists()
    if when == "building":
        assert seen == set(), f"Ray started after the Ctrl-C: {seen}"
    else:
        assert waited < 30, f"{waited:.0f} s from SIGINT to exit"
