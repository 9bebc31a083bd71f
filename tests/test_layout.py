"""The layout is the architecture: imports point downward, no import loops, one import path per name.

Every ``import`` in rollcap's source counts, the lazy ones inside functions
too (they are dependencies all the same). The parts of the design card rank
``kernels`` < ``capsule`` < ``policies``, ``envs`` < ``critics`` (it reads
observations as the policy does) < ``rollout``. Inside ``rollout`` the episode
core is at the bottom, then ``recording``, ``teleop``, ``gym``, the offline
tools, ``ray``, ``learn``, the Python door (``api``: it picks a run's placement), ``bench`` (it measures
the door too) and the command line on top. An import may go to its own
package or to a lower rank, never up or sideways, and no set of modules
imports itself in a loop. (Size is ruled per function, not per file: ruff's
complexity, branch, statement and argument limits in pyproject.toml.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = {
    "rollcap": "rollcap",
    "kernels": "rollcap.kernels",
    "capsule": "rollcap.capsule",
    "policies": "rollcap.policies",
    "critics": "rollcap.critics",
    "envs": "rollcap.envs",
    "rollout": "rollcap.rollout",
}

CORE = (
    "errors",
    "seeding",
    "stats",
    "episode",
    "events",
    "predicates",
    "protocols",
    "config",
    "options",
    "spec",
    "rtc",
    "resume",
    "lifecycle",
    "builder",
    "host",
    "subscribers",
    "named",
    "fits",
    "build",
    "batch",
    "placement",
    "groups",
)
RANK = {
    "rollcap.kernels": 0,
    "rollcap.capsule": 1,
    "rollcap.policies": 2,
    "rollcap.envs": 2,
    "rollcap.critics": 3,  # the critic reads observations as the policy does (policies.observation, policies.layers)
    "rollcap.rollout:core": 10,
    "rollcap.rollout.recording": 11,
    "rollcap.rollout.teleop": 12,
    "rollcap.rollout.gym": 13,
    "rollcap.rollout.offline": 14,
    "rollcap.rollout.ray": 15,
    "rollcap.rollout.workers": 15,  # env workers: one more episode source beside the Ray actors (core, recording below)
    "rollcap.rollout.learn": 16,
    "rollcap.rollout.api": 17,
    "rollcap.rollout.bench": 18,
    "rollcap.rollout.cli": 19,
}
"""Unit -> rank. A unit is a part, a subpackage of ``rollout`` or the episode core (its modules, CORE); units of one rank must not import each other."""
TOP = ("rollcap", "rollcap.rollout")
"""Package namespaces that only name things lazily (``rollcap.run`` and friends); they may reach any unit."""


def _modules() -> dict[str, Path]:
    out = {}
    for part, pkg in PARTS.items():
        for path in sorted((ROOT / part).rglob("*.py")):
            rel = path.relative_to(ROOT / part).with_suffix("")
            names = [n for n in rel.parts if n != "__init__"]
            out[".".join([pkg, *names])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The rollcap modules ``name`` imports (top level and inside functions), each resolved to a module of ours."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t.startswith("rollcap") and t != name and t not in (f"{name}.{x}" for x in ()):
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str | None:
    if module.rpartition(".")[0] == "rollcap.rollout" and module.rpartition(".")[2] in CORE:
        return "rollcap.rollout:core"
    best = None
    for unit in RANK:
        if module == unit or module.startswith(unit + "."):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def test_every_module_has_a_rank():
    """A new module or subpackage must be placed in the layering (add it to RANK, and to the README's layout table)."""
    missing = sorted(m for m in MODULES if m not in TOP and _unit(m) is None)
    assert not missing, f"modules with no place in the layering: {missing}"


def test_imports_point_downward():
    bad = []
    for mod, deps in GRAPH.items():
        if mod in TOP:
            continue
        u = _unit(mod)
        for dep in deps:
            if dep in TOP:  # the namespaces import nothing eagerly but gymnasium registration; below everything
                if mod.startswith("rollcap.rollout") or dep == "rollcap.rollout":
                    bad.append(f"{mod} -> {dep} (a package namespace)")
                continue
            v = _unit(dep)
            if v == u:
                continue
            if RANK[v] >= RANK[u]:
                bad.append(f"{mod} (rank {RANK[u]}) -> {dep} (rank {RANK[v]})")
    assert not bad, "imports that run up or sideways:\n" + "\n".join(sorted(bad))


def test_no_import_loops():
    """Tarjan's strongly connected components over every module: each must be a single module."""
    index, low, on, stack, loops = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not loops, f"import loops: {loops}"


def test_rollout_top_level_holds_the_core_and_the_doors_only():
    top = sorted(p.stem for p in (ROOT / "rollout").glob("*.py") if p.stem != "__init__")
    assert set(top) <= set(CORE) | {"api"}, (
        f"modules at rollout/ that are neither the episode core nor a door: {sorted(set(top) - set(CORE) - {'api'})}"
    )
    assert not any(p.name.startswith("bench") for p in (ROOT / "rollout").glob("*.py"))


def test_the_layering_sees_real_edges():
    """The checker itself: it resolves absolute, lazy and relative imports (a checker that sees nothing passes everything)."""
    assert "rollcap.rollout.build" in GRAPH["rollcap.rollout.api"]
    assert "rollcap.rollout.offline.deployment" in GRAPH["rollcap.rollout.offline.branch"]
    assert "rollcap.rollout.config" in GRAPH["rollcap.rollout.offline.branch"]  # imported inside a function
    assert "rollcap.kernels.files" in GRAPH["rollcap.rollout.offline.inspect"]
    assert len(GRAPH) > 100


SOURCES = [p for d in (*PARTS, "tests", "examples", "scripts") for p in sorted((ROOT / d).rglob("*.py"))]
"""Every Python file whose imports must name a home: the package, its tests, examples and scripts."""


def _bound_names(path: Path) -> tuple[set[str], dict[str, str]]:
    """A module's own top-level names (defined there) and the rollcap names it imports (name -> module imported from)."""
    own, imported = set(), {}
    todo = list(ast.parse(path.read_text(), str(path)).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.If, ast.Try)):  # a guarded definition is still the module's own
            todo += node.body + node.orelse + getattr(node, "finalbody", []) + getattr(node, "handlers", [])
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rollcap")):
            imported |= {a.asname or a.name: node.module or "." for a in node.names}
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            own |= {(a.asname or a.name).split(".")[0] for a in node.names}  # a third-party name: its home is not ours
    return own, imported


def _home_of(module: str, name: str) -> str | None:
    """Where ``name`` read from ``module`` is defined: ``module`` itself, or None when the module only imports it."""
    own, _ = _bound_names(MODULES[module])
    return module if name in own or f"{module}.{name}" in MODULES else None


def test_no_reexport_kept_for_an_old_path():
    """No ``from ... import name  # noqa: F401``: a name imported only to be read from here again is an old path kept
    alive. Side-effect imports (``import rollcap.envs  # registers ids``, ``import tkinter`` as a probe) stay."""
    bad = []
    for path in SOURCES:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if isinstance(node, ast.ImportFrom):
                span = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if "noqa: F401" in span:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "re-exports (import the name from its home instead): " + ", ".join(bad)


def test_every_name_is_imported_from_its_home():
    """``from rollcap.a.b import name`` names the module that defines ``name`` (one import path per name): a module
    that merely imports it is not a second address. Package ``__init__`` facades (their ``__all__``) are the public
    doors; their lazy maps must point at the homes too."""
    bad = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module not in MODULES:
                continue
            if MODULES[node.module].name == "__init__.py":
                continue
            for alias in node.names:
                if _home_of(node.module, alias.name) is None:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    for facade, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                if not any(isinstance(t, ast.Name) and t.id in ("_NAMES", "_ELSEWHERE") for t in node.targets):
                    continue
                for key, value in zip(node.value.keys, node.value.values):
                    target = value.value if value.value.startswith("rollcap") else f"{facade}.{value.value}"
                    if target not in MODULES or _home_of(target, key.value) is None:
                        bad.append(f"{path.relative_to(ROOT)} {key.value!r} -> {target}")
    assert not bad, "names imported from a module that is not their home:\n" + "\n".join(bad)


def test_the_import_checks_see_a_reexport():
    """The checker itself: a name a module only imports has no home there; one it defines has."""
    assert _home_of("rollcap.rollout.build", "Parts") is None  # build imports Parts from spec
    assert _home_of("rollcap.rollout.spec", "Parts") == "rollcap.rollout.spec"
    assert len(SOURCES) > 300


def test_the_episode_core_does_not_import_the_deployment_spec():
    """The host and the batched round know episodes, not deployments: importing them leaves the spec (and the build,
    the checkpoints it names) out of the process."""
    import subprocess
    import sys

    code = (
        "import sys, rollcap.rollout.host, rollcap.rollout.batch; "
        "print(sorted(m for m in ('rollcap.rollout.spec', 'rollcap.rollout.build') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
