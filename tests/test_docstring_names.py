"""Docstrings name real things: every dotted ``rollcap.*`` name in a docstring resolves (statically, from the source).

A name resolves when its longest module prefix is one of rollcap's modules and the rest is defined there: a
top-level class, function, assignment or import, then (for a class) a member of its body. A package namespace
that names things lazily (``__getattr__``) resolves what it lists. A class with bases may inherit a member:
its unknown members are not judged.
"""

from __future__ import annotations

import ast
import re

from tests.test_layout import MODULES

NAME = re.compile(r"(?<![\w/.])rollcap(?:\.[A-Za-z_]\w*)+")


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out[(a.asname or a.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = node.body + getattr(node, "orelse", []) + [s for h in getattr(node, "handlers", []) for s in h.body]
            out.update(_defined(inner))
    return out


TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}
DEFS = {name: _defined(tree.body) for name, tree in TREES.items()}


def _lazy(module: str) -> set[str] | None:
    """The names a package namespace with ``__getattr__`` gives (None: it has no ``__getattr__``)."""
    if "__getattr__" not in DEFS[module]:
        return None
    names: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Dict):
            names |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
    return names


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in MODULES:
            break
    else:
        return False
    rest = parts[cut:]
    if not rest:
        return True
    found = DEFS[module].get(rest[0])
    if found is None:
        lazy = _lazy(module)
        return lazy is not None and rest[0] in lazy
    for attr in rest[1:]:
        if not isinstance(found, ast.ClassDef):
            return True  # a function's attribute, an instance's: not judged
        members = _defined(found.body)
        if attr not in members:
            return bool(found.bases)  # inherited, maybe
        found = members[attr]
    return True


def _docstrings(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node, doc
        if isinstance(node, (ast.ClassDef, ast.Module)):  # attribute docstrings: a string after a field
            for a, b in zip(node.body, node.body[1:]):
                if (
                    isinstance(a, (ast.Assign, ast.AnnAssign))
                    and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant)
                    and isinstance(b.value.value, str)
                ):
                    yield b, b.value.value


def test_docstring_names_resolve():
    bad = []
    for module, tree in TREES.items():
        for node, doc in _docstrings(tree):
            for m in NAME.finditer(doc):
                name = m.group(0).rstrip(".")
                if not resolves(name):
                    bad.append(f"{MODULES[module].name} ({module}:{getattr(node, 'lineno', 0)}): {name}")
    assert not bad, "docstrings name things that do not exist:\n" + "\n".join(sorted(set(bad)))


def test_the_resolver_sees_a_wrong_name():
    assert resolves("rollcap.rollout.host.RolloutHost.run_episode")
    assert resolves("rollcap.rollout.build")
    assert not resolves("rollcap.rollout.policies.EagerPolicy")
    assert not resolves("rollcap.rollout.build.no_such_function")
