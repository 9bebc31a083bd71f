"""Ctrl-C in the first two seconds of `rollcap run` (imports, checkpoint loading, capture): exit 130, one line, nothing written.

The command holds SIGINT from rollcap's first line: ``rollcap/__init__.py``
blocks SIGINT and SIGTERM before any other import when the process is the
``rollcap`` command, and ``main`` unblocks them once its handler is in place
(which holds a signal until start-up ends). So a Ctrl-C while modules still
import takes effect when start-up ends, as README says, instead of a
KeyboardInterrupt traceback from inside an import. ``import rollcap`` in
your own program blocks nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("rollcap")
"""The console script pip wrote beside this interpreter (not a shell shim in front of it)."""
MOMENTS = (0.0, 0.03, 0.1, 0.2, 0.4, 0.8, 1.2, 2.0)
"""Seconds after rollcap's first line blocked SIGINT (seen in ``/proc/PID/status``): the whole start-up after it.

Before that line only the interpreter's own initialisation and the console
script's search for the package run, where no program can handle a signal;
the test starts its clock at the line, so every moment it tries is rollcap's."""


def wait_until_held(proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Return once ``proc``'s main thread blocks SIGINT (``import rollcap``'s first lines did it: ``SigBlk`` in
    ``/proc/PID/status``), or once ``main`` has put its handler in place (``SigCgt`` holds SIGTERM, which Python
    itself never catches), if this poller slept through the block: about 1.2 s here, but a busy 2-core CI box has
    descheduled the poller for longer than that. Either way the signal sent next lands in start-up, after rollcap's
    first line."""
    status, cmdline = Path(f"/proc/{proc.pid}/status"), Path(f"/proc/{proc.pid}/cmdline")
    sigint, sigterm = 1 << (signal.SIGINT - 1), 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            execed = str(SCRIPT).encode() in cmdline.read_bytes()  # not the forked child still blocking all before exec
        except OSError:  # the process ended
            break
        if execed and (int(fields["SigBlk"].strip(), 16) & sigint or int(fields["SigCgt"].strip(), 16) & sigterm):
            return
        time.sleep(0.0005)
    raise AssertionError(f"rollcap never held SIGINT at start-up (exit {proc.poll()})")


@pytest.mark.slow
def test_import_rollcap_imports_nothing_heavy():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, rollcap.rollout.cli; print(sorted(m for m in ('gymnasium', 'numpy', 'torch', 'mujoco') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_import_rollcap_in_a_program_blocks_no_signal():
    """Only the command holds signals at import: a program importing rollcap keeps its signal mask."""
    code = "import rollcap, _signal; print(sorted(_signal.pthread_sigmask(_signal.SIG_BLOCK, set())))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


@pytest.mark.slow
def test_gym_ids_register_when_gymnasium_is_imported_after_rollcap():
    code = (
        "import rollcap, gymnasium as gym; e = gym.make('rollcap/ChunkPushBlock-v0'); print(type(e.unwrapped).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ChunkEnv"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask from /proc (Linux)")
@pytest.mark.parametrize("at", MOMENTS)
def test_ctrl_c_during_start_up_exits_130_with_one_line(tmp_path, at):
    """Ctrl-C at each moment of start-up, counted from the line that holds it: exit 130 (or 0), one line, no partial file."""
    assert SCRIPT.exists(), f"the rollcap console script is not installed at {SCRIPT}"
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "run", "--episodes", "50", "--out", str(out), "--no-progress", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until_held(proc)
    time.sleep(at)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (130, 0), (
        f"at {at}s: exit {proc.returncode} (a negative code is a death by signal)\n{stderr}"
    )
    assert "Traceback" not in stderr, f"at {at}s:\n{stderr}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, f"at {at}s, more than the interrupted line:\n{stderr}"
    if proc.returncode == 130:
        assert any("interrupted" in line for line in lines), stderr
    partial = (
        [p for p in out.rglob("*") if p.is_file() and (".tmp" in p.name or p.name.startswith("."))]
        if out.exists()
        else []
    )
    assert not partial, f"partial files left: {partial}"
