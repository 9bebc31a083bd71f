"""A ``MUJOCO_GL`` that MuJoCo cannot start with never takes a command down: ``--help`` and the built-in task (rendered
in numpy) work, and what would render through MuJoCo is refused in one line naming ``MUJOCO_GL``.

Real ``rollcap`` processes. libOSMesa is installed on this machine, so its absence is made in the subprocess by a
``sitecustomize`` that hides the library from ``ctypes`` (find_library and dlopen), as an uninstalled one is hidden.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HIDE_OSMESA = """
import ctypes, ctypes.util
_find, _init = ctypes.util.find_library, ctypes.CDLL.__init__
def find_library(name):
    return None if "OSMesa" in name else _find(name)
def __init__(self, name, *args, **kwargs):
    if name and "OSMesa" in str(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    _init(self, name, *args, **kwargs)
ctypes.util.find_library, ctypes.CDLL.__init__ = find_library, __init__
"""


def _rollcap(tmp_path, gl: str, *args) -> subprocess.CompletedProcess:
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE_OSMESA)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(MUJOCO_GL=gl, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.getcwd()]))
    cmd = [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("gl", ["osmesa", "bogus"])
def test_a_mujoco_gl_that_cannot_start_is_one_line_and_never_stops_help_or_the_built_in_task(tmp_path, gl):
    """MUJOCO_GL=osmesa without libOSMesa, or a value MuJoCo does not know: --help exits 0, a run of the built-in task
    records its episode, and a MetaWorld run with images is refused in one line naming MUJOCO_GL and the reason (exit 2,
    no traceback, nothing created). They used to die importing mujoco, with a traceback, every command alike."""
    res = _rollcap(tmp_path, gl, "--help")
    assert res.returncode == 0 and "Traceback" not in res.stderr and "rollcap run" in res.stdout, res.stderr[-2000:]
    res = _rollcap(tmp_path, gl, "run", "--episodes", 1, "--max-chunks", 2, "--critic", "none", "--no-progress",
                   "--out", tmp_path / "builtin")  # fmt: skip
    assert res.returncode == 0 and "episodes         1" in res.stdout, res.stderr[-2000:]
    pytest.importorskip("metaworld")
    res = _rollcap(tmp_path, gl, "run", "--env", "rollcap/MetaWorld-reach-v3", "--policy", "expert", "--critic", "none",
                   "--episodes", 1, "--env-kwargs", json.dumps({"image_size": 32, "max_steps": 12}), "--no-progress",
                   "--out", tmp_path / "mw")  # fmt: skip
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    why = "libOSMesa is not installed" if gl == "osmesa" else "MuJoCo knows egl, osmesa, glfw (or disabled)"
    assert f"MUJOCO_GL={gl} cannot render here: {why}" in lines[0] and not (tmp_path / "mw").exists()
