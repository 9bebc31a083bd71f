"""A Ray node lost under ``rollcap run --actors``: one rollcap line naming it, Ray's own log in a file of the run, exit 1
when nothing is left to run on (the machines failed, not the user), exit 0 when the run went on without it.

One cluster for the module: a head with no CPU (so every actor is placed on a worker node this test controls) and
worker nodes added per test. The run is the ``rollcap`` command in a subprocess (its own driver); a worker node is
lost by SIGKILL of its raylet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rollout._tiny import ENV_KW

pytestmark = pytest.mark.slow(seconds=90)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    from rollcap.rollout.ray.connect import FORK_SAFE_ENV

    if ray.is_initialized():
        ray.shutdown()
    mp = pytest.MonkeyPatch()
    for k, v in {**FORK_SAFE_ENV, "RAY_AUTH_MODE": "disabled"}.items():
        mp.setenv(k, v)
    fast = {"health_check_period_ms": 1000, "health_check_timeout_ms": 3000, "health_check_failure_threshold": 10}
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": fast}
    )
    try:
        yield c
    finally:
        c.shutdown()
        mp.undo()


def _raylet(node) -> int:
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def _children(pid: int) -> list[int]:
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid:
            out.append(int(status.parent.name))
    return out


def _start(cluster, ckpt, out: Path, actors: int, episodes: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", "run", "--episodes", str(episodes), "--actors", str(actors),
           "--address", cluster.address, *ckpt[:4], "--env-kwargs", json.dumps(ENV_KW), "--max-chunks", "6",
           "--no-progress", "--out", str(out)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _until(check, timeout_s=240.0, what=""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _rollcap_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and " MuJoCo: compiler attribute" not in ln]


def test_the_only_node_lost_while_actors_start_is_exit_1_in_one_line(cluster, ckpt, tmp_path):
    """The worker raylet killed while its actor starts: exit 1 (not 2: no user mistake), one line naming the node,
    Ray's own messages in RUN/ray.log and none on the terminal."""
    if sys.platform != "linux":
        pytest.skip("finds the actor's worker process in /proc")
    node = cluster.add_node(num_cpus=1, include_dashboard=False)
    cluster.wait_for_nodes()
    raylet = _raylet(node)
    proc = _start(cluster, ckpt, tmp_path / "run", actors=1, episodes=5)
    _until(lambda: _children(raylet) or proc.poll() is not None, what="the actor's worker process")
    assert proc.poll() is None, proc.communicate()
    os.kill(raylet, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    cluster.remove_node(node, allow_graceful=False)  # the rest of its processes; the next test's nodes are waited for
    lines = _rollcap_lines(stderr)
    assert proc.returncode == 1, stdout + stderr
    assert len(lines) == 1 and lines[0].startswith("rollcap run: error: every actor was lost while starting"), stderr
    assert "its node died" in lines[0] and "Traceback" not in stderr and "Raylet" not in stdout + stderr
    assert f"Ray's messages in {tmp_path / 'run' / 'ray.log'}" in lines[0] and (tmp_path / "run" / "ray.log").is_file()


def test_a_node_lost_mid_run_is_one_line_and_the_run_goes_on(cluster, ckpt, tmp_path):
    """A worker raylet killed mid-run: its episode runs again on the other node's actor; one rollcap line names the lost
    node and the retried episode; Ray's raylet report is in RUN/ray.log, not on the terminal; exit 0, every episode."""
    nodes = [cluster.add_node(num_cpus=1, include_dashboard=False) for _ in range(2)]
    cluster.wait_for_nodes()
    out = tmp_path / "run"
    episodes = 400
    proc = _start(cluster, ckpt, out, actors=2, episodes=episodes)
    manifest = out / "manifest.jsonl"

    def both_busy() -> bool:
        return proc.poll() is not None or (manifest.is_file() and len(manifest.read_text().splitlines()) >= 4)

    _until(both_busy, what="the first episodes")
    assert proc.poll() is None, proc.communicate()
    os.kill(_raylet(nodes[0]), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stdout + stderr
    lost = [ln for ln in _rollcap_lines(stderr) if "lost an actor" in ln]
    assert len(lost) == 1, stderr
    assert lost[0].startswith("rollcap: lost an actor on ") and "(its node died); episode " in lost[0], lost
    assert "runs again on a live actor" in lost[0]
    assert f"Ray's messages in {out / 'ray.log'}" in lost[0]
    assert "Raylet is terminated" not in stdout + stderr and "Raylet is terminated" in (out / "ray.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == episodes and summary["retries"] >= 1 and summary["failed"] == {}
