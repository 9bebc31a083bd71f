"""The README's Python examples run as written (in a scratch directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = (
    pytest.mark.slow
)  # subprocesses, Ray or trained examples: the fast tier (-m "not slow") leaves them to the full suite

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_a_short_first_example():
    """The first example is at most five lines of code."""
    assert len(BLOCKS) >= 2
    assert len([ln for ln in BLOCKS[0].splitlines() if ln.strip()]) <= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    """Each ```python block of the README runs; those that call rollcap.run record their episodes."""
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    if "rollcap.run(" in BLOCKS[index]:
        assert list(tmp_path.glob("runs/*/episodes.hdf5")), "the example recorded nothing"
