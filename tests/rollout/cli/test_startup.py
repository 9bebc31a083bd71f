"""Start-up stays light: ``import rollcap``, the config modules, the command line's parser and an env worker's modules
import no torch (and the parser no MuJoCo or h5py either), so ``rollcap --help`` answers in a fraction of a second.

Checked on ``sys.modules`` in fresh interpreters (the time itself is a benchmark figure: ``rollcap bench --only
startup``). A refactor that puts ``import torch`` back on one of these paths fails here, naming the module.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "mujoco", "h5py")
"""What the parser must not import: torch (1.5-2 s, 200 MB), MuJoCo (0.2 s), h5py (0.1 s)."""

TORCH_FREE = (
    "rollcap",
    "rollcap.kernels",
    "rollcap.capsule",
    "rollcap.capsule.verbs",
    "rollcap.policies",
    "rollcap.policies.observation",
    "rollcap.critics",
    "rollcap.envs",
    "rollcap.rollout.config",
    "rollcap.rollout.options",
    "rollcap.rollout.spec",
    "rollcap.rollout.build",
    "rollcap.rollout.host",
    "rollcap.rollout.recording",
    "rollcap.rollout.workers.child",
)
"""Modules importable without torch, in the order checked (an env worker imports the last and what it needs)."""

_PROBE = """
import json, sys
def loaded(names):
    return sorted({{m.split(".")[0] for m in sys.modules}} & set(names))
{body}
"""


def _python(body: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_these_modules_import_no_torch():
    """Each of TORCH_FREE, imported in turn in one fresh interpreter, leaves torch out of sys.modules."""
    got = _python(f"""
first = None
for name in {list(TORCH_FREE)!r}:
    __import__(name)
    if first is None and loaded(("torch",)):
        first = name
print(json.dumps({{"first": first}}))
""")
    assert got["first"] is None, f"importing {got['first']} imported torch"


def test_the_parser_and_every_command_help_import_no_torch():
    """``rollcap --help`` and ``rollcap COMMAND --help`` for every command, through the console entry point's main,
    import no torch, MuJoCo or h5py; then something that needs torch (a run's runners) does import it."""
    got = _python(f"""
from rollcap.rollout.cli import main
from rollcap.rollout.cli.commands import build_parser
commands = sorted(build_parser()._subparsers._group_actions[0].choices)
seen = {{}}
for argv in [["--help"]] + [[c, "--help"] for c in commands if c != "capsule"] + [["capsule", "inspect", "--help"]]:
    try:
        main(argv)
    except SystemExit:
        pass
    seen[" ".join(argv)] = loaded({HEAVY!r})
from rollcap.rollout.build import policy_runner  # a run's runner: needs torch
import rollcap.policies
rollcap.policies.PolicyRunner
print(json.dumps({{"commands": commands, "seen": seen, "after": "torch" in sys.modules}}))
""")
    assert {"run", "replay", "inspect", "export", "branch", "bench", "recap", "merge", "capsule"} <= set(
        got["commands"]
    )
    heavy = {argv: mods for argv, mods in got["seen"].items() if mods}
    assert not heavy, f"--help imported {heavy}"
    assert got["after"], "PolicyRunner came without torch: the check above could not see an import"
