"""Placements: one contract (rollout/placement.py) that every way of running meets, and making one starts nothing."""

from __future__ import annotations

import ast
import importlib
import inspect
import multiprocessing
import sys
from pathlib import Path

import pytest

from rollcap.rollout.api import placement_for
from rollcap.rollout.build import build
from rollcap.rollout.placement import InProcess, Placement
from rollcap.rollout.spec import Spec

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ("start", "episodes", "close", "summary")


def _placement_modules() -> list[str]:
    """Every module of rollout/ that defines a class deriving from ``Placement``."""
    out = []
    for path in sorted((ROOT / "rollout").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Placement" for b in node.bases):
                out.append(".".join(("rollcap", *path.relative_to(ROOT).with_suffix("").parts)))
                break
    return out


def _placements() -> list[type]:
    classes = []
    for name in _placement_modules():
        module = importlib.import_module(name)
        classes += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
    return [c for c in classes if issubclass(c, Placement) and c is not Placement]


def test_every_placement_meets_the_contract():
    """Each placement (in process, teleop, env workers, Ray actors) is a concrete Placement whose contract methods
    take exactly the base's arguments: a placement that drifts (another ``start`` signature) fails here."""
    found = {c.__name__ for c in _placements()}
    assert found == {"InProcess", "TeleopPlacement", "EnvWorkersPlacement", "ActorsPlacement"}, found
    for cls in _placements():
        assert not inspect.isabstract(cls), f"{cls.__name__} leaves {sorted(cls.__abstractmethods__)} abstract"
        for name in CONTRACT:
            got, want = inspect.signature(getattr(cls, name)), inspect.signature(getattr(Placement, name))
            assert list(got.parameters) == list(want.parameters), f"{cls.__name__}.{name}{got} drifts from {want}"


def test_no_placement_reads_the_sinks_insides():
    """A placement is handed what it records into (``shards``), never a sink to look inside."""
    for name in _placement_modules():
        source = inspect.getsource(importlib.import_module(name))
        assert ".recorder" not in source and "sinks" not in source, name


@pytest.mark.parametrize("run", [{}, {"envs": 2}, {"envs": 2, "env_workers": 2}, {"actors": 2}, {"teleop": "terminal"}])
def test_making_a_placement_starts_nothing(run, tmp_path):
    """The spec's placement is made without a process, a Ray actor or a terminal; ``close`` before ``start`` is fine."""
    spec = Spec.of(1, tmp_path / "out", critic="none", **run)
    built = build(spec, check_env=False)
    try:
        placement = placement_for(spec, built)
        assert multiprocessing.active_children() == []
        assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
        assert isinstance(placement, Placement) and (run or isinstance(placement, InProcess))
        assert placement.identity.config.execute_steps is not None  # resolved as the hosts resolve it
        placement.close()
        placement.close()
    finally:
        built.close()
