"""Only a closed stdout is read as a closed stdout: ``rollcap inspect RUN | head`` stops quietly with 0; a broken pipe
anywhere else (a worker that died) is a failure, never a quiet 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import rollcap.rollout.api as api
from rollcap.rollout.cli import _stdout_closed, main

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


@pytest.mark.slow(seconds=5)
def test_a_reader_that_went_away_stops_the_command_quietly(tmp_path):
    """stdout a pipe whose reader has closed (``| head`` done reading): exit 0, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)  # before the command writes a byte (its start-up takes seconds)
    try:
        res = subprocess.run([*ROLLCAP, "--help"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert res.returncode == 0 and res.stderr == ""


def test_a_broken_pipe_that_is_not_stdout_is_a_failure(monkeypatch, tmp_path, capsys):
    """A BrokenPipeError from another pipe (a dead process's) ends the command with one line and exit 1, not a quiet 0."""
    read, write = os.pipe()
    os.close(read)

    def dead_peer(*args, **kwargs):
        os.write(write, b"go")  # the peer is gone: EPIPE

    monkeypatch.setattr(api, "run", dead_peer)  # cmd_run imports it when it runs
    try:
        code = main(["run", "--episodes", "1", "--no-progress", "--out", str(tmp_path / "r")])
    finally:
        os.close(write)
    err = capsys.readouterr().err
    assert code == 1 and err == "rollcap run: error: [Errno 32] Broken pipe\n"


def test_stdout_closed_tells_a_gone_reader_from_a_live_one(monkeypatch):
    """stdout on a pipe: closed once its reader is gone, not while it reads; a stdout without a descriptor: not closed."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not _stdout_closed()
        os.close(read)
        assert _stdout_closed()
        monkeypatch.undo()
    assert not _stdout_closed()  # pytest's capture: no descriptor
