"""Ctrl-C in the first two seconds of `rollcap run` (imports, checkpoint loading, capture): exit 130, one line, nothing written.

The console script holds SIGINT from its first line (``import rollcap`` imports
nothing heavy; gymnasium ids register after gymnasium's own import), so a
Ctrl-C while modules still import takes effect when start-up ends, as README
says, instead of a KeyboardInterrupt traceback from inside an import.
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
"""Seconds after the interpreter's own start-up (measured: ``python -c pass``), i.e. after the entry point's first line can run.

A signal before that lands in Python's own initialisation (site-packages
``.pth`` files), where no program can handle it yet."""


SITE_INIT = "init_import_site: Failed to import the site module"
"""CPython's own message when a signal interrupts its site initialisation."""


def landed_before_rollcap(stderr: str) -> bool:
    """The signal interrupted the interpreter before any of rollcap's code ran: CPython's site initialisation, or the
    console script's ``from rollcap... import main`` still searching for the package (a traceback whose every frame is
    the script's own line or importlib's frozen code). No program can handle a signal there."""
    if SITE_INIT in stderr:
        return True
    if "KeyboardInterrupt" not in stderr or "Traceback" not in stderr:
        return False
    frames = [line.strip() for line in stderr.splitlines() if line.strip().startswith('File "')]
    if bool(frames) and all(f.startswith(f'File "{SCRIPT}"') or f.startswith('File "<frozen ') for f in frames):
        return True
    # Inside the stdlib's own ``import signal`` (it builds its enums for some ms): the module rollcap needs before it can
    # hold a signal at all. Seen once in 8 clean-clone runs at the 0.0 s moment.
    stdlib_signal = [
        f for f in frames if f.startswith('File "') and f.split('"')[1].endswith(("/signal.py", "/enum.py"))
    ]
    return bool(stdlib_signal) and "import signal" in stderr and frames[-1] in stdlib_signal


@pytest.fixture(scope="module")
def interpreter_start_s():
    """The longest of 5 bare interpreter start-ups: with the median, a start-up slower than usual (a busy machine) put
    the 0.0 s signal inside site initialisation, where no program can handle it (seen in 2 of 14 runs)."""
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        walls.append(time.perf_counter() - t0)
    return max(walls)


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


@pytest.mark.slow
def test_gym_ids_register_when_gymnasium_is_imported_after_rollcap():
    code = (
        "import rollcap, gymnasium as gym; e = gym.make('rollcap/ChunkPushBlock-v0'); print(type(e.unwrapped).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ChunkEnv"


@pytest.mark.slow
@pytest.mark.parametrize("at", MOMENTS)
def test_ctrl_c_during_start_up_exits_130_with_one_line(tmp_path, at, interpreter_start_s):
    assert SCRIPT.exists(), f"the rollcap console script is not installed at {SCRIPT}"
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                "run",
                "--episodes",
                "50",
                "--out",
                str(out),
                "--no-progress",
                "--threads",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(interpreter_start_s + at)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        if not landed_before_rollcap(stderr):
            break
        # This start-up was slower than the measured ones and the signal landed before rollcap's first line (Python's
        # site initialisation, or the console script still finding the package): that sample says nothing about
        # rollcap; take another. Seen on a busy box (load 6): a traceback of importlib frames only.
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
