"""``--address HOST:PORT`` and a head started with Ray's token authentication (``RAY_AUTH_MODE=token ray start --head``).

One head for the module, started as a user starts one: ``ray start --head --block`` in a subprocess
(its own session and process group, its own temp dir and ports, on loopback), its token in a file
named by ``RAY_AUTH_TOKEN_PATH``. It is stopped with SIGTERM (``--block`` then stops its node), and
what is left of its process group is killed. ``ray stop`` is not used: it stops every Ray on the machine.

The run that joins it runs in its own interpreter with ``HOME`` set to a folder holding the token in
``.ray/auth_token`` (where Ray's CLI looks) and no ``RAY_*`` variables: this process's Ray state
(token mode cached by an earlier module's local ``ray.init``) cannot make it pass. The refusals
happen before ``ray.init`` (rollcap asks the head's GCS first), so they run in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import rollcap
from rollcap.rollout.recording import episode_digest
from tests.rollout._tiny import ENV_KW

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "rollcap-test-token-" + "5" * 32
pytestmark = pytest.mark.slow


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _clean_env(**more) -> dict:
    """This process's environment without Ray's variables (a token or mode here would decide the case), plus ``more``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(GRPC_ENABLE_FORK_SUPPORT="false", RAY_USAGE_STATS_ENABLED="0", **more)
    return env


@pytest.fixture(scope="module")
def head():
    """``address`` of a one-CPU head with token authentication on; stopped after the module."""
    pytest.importorskip("ray")
    pytest.importorskip("grpc")
    tmp = Path(tempfile.mkdtemp(prefix="rc-tok-", dir="/tmp"))  # short: Ray's socket paths live under it
    (tmp / "token").write_text(TOKEN)
    port, nm, om, rea, dag, dal, met, cli, w0 = _free_ports(9)
    args = [
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "1",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--temp-dir",
        str(tmp / "ray"),
        "--node-manager-port",
        str(nm),
        "--object-manager-port",
        str(om),
        "--runtime-env-agent-port",
        str(rea),
        "--dashboard-agent-grpc-port",
        str(dag),
        "--dashboard-agent-listen-port",
        str(dal),
        "--metrics-export-port",
        str(met),
        "--ray-client-server-port",
        str(cli),
        "--min-worker-port",
        str(w0),
        "--max-worker-port",
        str(min(w0 + 40, 65535)),
    ]
    env = _clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp / "token"))
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = (
        [str(ray_cli)]
        if ray_cli.exists()
        else [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]
    )
    log = open(tmp / "head.log", "w")
    proc = subprocess.Popen(
        [*cmd, "start", *args], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while not (tmp / "ray" / "ray_current_cluster").exists():  # written once the head is up, before --block waits
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "head.log").read_text()[-3000:]
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{port}", "dir": tmp}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session's leftovers (agents, workers)
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _names(ckpt) -> dict:
    return {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
        "seed": 4,
        "max_chunks": 4,
    }


def test_the_token_from_ray_s_default_file_joins_and_records_the_in_process_run_s_episodes(head, ckpt, tmp_path):
    """RAY_AUTH_MODE unset, the token only in ~/.ray/auth_token (as `ray get-auth-token` leaves it): the run joins, one line of
    summary names the address, and the episodes' digests equal an in-process run's."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(TOKEN)
    out = tmp_path / "cluster"
    cmd = [
        sys.executable,
        "-m",
        "rollcap.rollout.cli",
        "run",
        "--episodes",
        "3",
        "--actors",
        "1",
        "--address",
        head["address"],
        "--seed",
        "4",
        "--max-chunks",
        "4",
        "--out",
        str(out),
        *ckpt,
    ]
    res = subprocess.run(cmd, cwd=ROOT, env=_clean_env(HOME=str(home)), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "requires a token" not in res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["address"], summary["episodes"], summary["failed"]) == (head["address"], 3, {}), summary
    local = rollcap.run(3, out=tmp_path / "local", **_names(ckpt))
    assert {r.index: episode_digest(r) for r in rollcap.load(out)} == {
        r.index: episode_digest(r) for r in rollcap.load(local.run_dir)
    }


@pytest.mark.parametrize("case", ["no token", "wrong token file", "unreadable token file", "mode disabled"])
def test_a_missing_or_refused_token_is_one_line_exit_2_and_no_run_dir(head, ckpt, tmp_path, monkeypatch, capsys, case):
    """No token anywhere Ray looks, one the head refuses, a RAY_AUTH_TOKEN_PATH naming nothing, RAY_AUTH_MODE=disabled:
    `rollcap run --address HOST:PORT` prints one line naming --address and why, exits 2, and creates nothing (not Ray's
    "Failed to connect to Ray cluster at <node ip>" after ~20 s of retries)."""
    from rollcap.rollout.cli import main

    for k in [k for k in os.environ if k.startswith("RAY_AUTH")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ray/auth_token
    wrong = tmp_path / "wrong_token"
    wrong.write_text("not-" + TOKEN)
    env = {
        "no token": {},
        "wrong token file": {"RAY_AUTH_TOKEN_PATH": str(wrong)},
        "unreadable token file": {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent")},
        "mode disabled": {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": TOKEN},
    }[case]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    why = {
        "no token": "and none was found: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file holding it, or put it in ~/.ray/auth_token",
        "wrong token file": f"and refused the one from RAY_AUTH_TOKEN_PATH ({wrong})",
        "unreadable token file": f"; RAY_AUTH_TOKEN_PATH names no readable token file ({tmp_path / 'absent'})",
        "mode disabled": "and RAY_AUTH_MODE=disabled is set here",
    }[case]
    out = tmp_path / "run"
    started = time.monotonic()
    code = main(["run", "--episodes", "2", "--actors", "1", "--address", head["address"], "--out", str(out), *ckpt])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rollcap run: error: --address: the Ray cluster at {head['address']} requires a token (Ray token authentication)"
    ), err
    assert why in lines[0], lines[0]
    assert not out.exists()
    assert time.monotonic() - started < 15  # no Ray retries
