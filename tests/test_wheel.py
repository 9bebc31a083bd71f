"""The built wheel is the whole package: installed without ``-e`` into a fresh venv, every command runs from it.

The wheel is built from this checkout (``pip wheel --no-deps``) and installed
into a new venv that sees this interpreter's site-packages for rollcap's
dependencies (torch, mujoco, ...), so nothing is downloaded; rollcap itself
must come from the wheel, which the test checks. "This interpreter's" is the
point: run from a virtualenv (where most users install), the packages are in
that venv, not in the base Python a new venv's ``system_site_packages`` would
show, so the new venv is given this interpreter's site directories by a
``.pth`` file (``.ci/run`` runs this module once more from a venv). Then ``rollcap COMMAND --help``
for every command, and a 2-episode ``rollcap run`` + ``rollcap replay`` with the
shipped weights, from a directory outside the checkout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["run"], ["replay"], ["inspect"], ["branch"], ["recap"], ["bench"], ["capsule", "inspect"])

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    dist, src = tmp / "dist", tmp / "src"
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, and the checkout stays as it was.
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache", ".gl", ".whl"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = dist.glob("rollcap-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    _see_these_packages(py)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return py, env_dir / "bin" / "rollcap", wheel


def _site_dirs() -> list[str]:
    """This interpreter's site directories, in its order: a venv's own first, then what it sees of its base Python."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]


def _see_these_packages(py: Path) -> None:
    """Make the venv of ``py`` see :func:`_site_dirs` after its own site-packages (``.pth`` files in them included)."""
    own = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in _site_dirs()]
    Path(own, "_rollcap_test_parent_site.pth").write_text("\n".join(lines) + "\n")


def _run(args, cwd, timeout=300):
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_every_package_and_the_weights(installed, tmp_path):
    py, _, wheel = installed
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    for sub in ROOT.joinpath("rollout").rglob("__init__.py"):
        rel = sub.relative_to(ROOT / "rollout").parent
        assert f"rollcap/rollout/{rel.as_posix() + '/' if rel.parts else ''}__init__.py" in names, (
            f"{rel} missing from the wheel"
        )
    assert any(n.startswith("rollcap/policies/weights/") and n.endswith(".safetensors") for n in names)
    assert any(n.startswith("rollcap/critics/weights/") and n.endswith(".safetensors") for n in names)
    out = _run(
        [py, "-c", "import rollcap, rollcap.rollout.learn.recap, rollcap.rollout.cli.recap; print(rollcap.__file__)"],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert str(ROOT) not in out.stdout and "site-packages" in out.stdout, (
        f"rollcap came from {out.stdout.strip()}, not the installed wheel"
    )


def test_the_wheel_venv_sees_this_interpreters_packages(installed, tmp_path):
    """From a virtualenv too: the wheel's venv imports torch where this interpreter does (not from the base Python)."""
    import torch

    py, _, _ = installed
    out = _run([py, "-c", "import sys, torch; print(torch.__file__); print(sys.path)"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == torch.__file__
    assert all(d in out.stdout.splitlines()[1] for d in _site_dirs()), (out.stdout, _site_dirs())


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_helps_from_the_wheel(installed, tmp_path, command):
    _, rollcap, _ = installed
    out = _run([rollcap, *command, "--help"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: rollcap")


def test_run_and_replay_from_the_wheel(installed, tmp_path):
    _, rollcap, _ = installed
    run = _run(
        [rollcap, "run", "--episodes", "2", "--out", tmp_path / "run", "--no-progress", "--threads", "1"], cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    rep = _run([rollcap, "replay", tmp_path / "run"], cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "2 episode(s)" in rep.stdout and "all exact" in rep.stdout
