"""Command-line options derived from config dataclasses: one place for every default and its help.

Each field of a config dataclass becomes one flag: its name (``max_chunks`` ->
``--max-chunks``, or the field's ``metadata["flag"]``, or a name given in ``flags``), its type (``int``, ``float``,
``str``, ``Path``, ``bool``, ``X | None``, ``Literal[...]``, ``tuple[str | int | float, ...]``
as a comma list, ``dict`` as JSON), its default, and its help from the
docstring written under the field. :func:`values` turns parsed arguments back
into field values. A :class:`~rollcap.rollout.errors.ConfigError` names a
field; :meth:`Options.flag` maps it to the flag the user typed, and
:meth:`Options.spell` writes the field names a message quotes in backticks
(`` `resume=True` ``, `` `actors` ``) as flags (``--resume``, ``--actors``), so
one message serves both the Python API and the command line.

Knows nothing of rollouts: any dataclass works (the CLI's configs, and the
training scripts' under ``rollout/learn/``, which is why it sits in the core).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal


class UserError(Exception):
    """A mistake in arguments or input files: printed as one line, exit code 2."""


class BadFlag(UserError):
    """A flag's value is wrong: ``flag`` and what (a script prints it as its one line)."""

    def __init__(self, flag: str, what: str):
        super().__init__(f"{flag}: {what}")


def writable_dir(path: Path, flag: str) -> None:
    """BadFlag naming ``flag`` unless ``path`` is, or can be made as, a directory: its nearest existing ancestor takes
    a new directory (probed with a temporary one, removed). Leaves nothing."""
    import os
    import tempfile

    if path.exists() and not path.is_dir():
        raise BadFlag(flag, f"{path} exists and is not a directory")
    anc = path
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise BadFlag(flag, f"{anc} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=anc))
    except OSError as err:
        raise BadFlag(flag, f"cannot create a directory in {anc} ({err.strerror or err})") from None


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, by field name: its first paragraph (the field's one-line help in
    ``--help``; the paragraphs after a blank line are the longer doc, read in the source)."""
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:
        path = None
    node = _class_node(path, cls.__qualname__) if path else None
    if node is None:  # a class made in a function (its qualname names <locals>): inspect finds its source
        try:
            node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
        except (OSError, TypeError, SyntaxError, IndexError):  # no source (e.g. a frozen app): no help text
            return {}
    docs = {}
    for field_node, nxt in zip(node.body, node.body[1:]):
        if isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[field_node.target.id] = " ".join(nxt.value.value.strip().split("\n\n")[0].split())
    return docs


@functools.cache
def _module_tree(path: str) -> ast.Module | None:
    """A source file parsed once (the parser reads the docs of several classes from one module)."""
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _class_node(path: str, qualname: str) -> ast.ClassDef | None:
    scope = _module_tree(path)
    for name in qualname.split("."):
        body = getattr(scope, "body", [])
        scope = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == name), None)
    return scope if isinstance(scope, ast.ClassDef) else None


def _parse_json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg} at char {err.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def json_object(text: str) -> dict:
    """An argparse ``type``: a JSON object (errors name what was wrong)."""
    return _parse_json_object(text)


json_object.__name__ = "JSON"


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(s for s in text.split(",") if s)


def _named(fn, name: str):
    fn.__name__ = name  # argparse names the type in "invalid <name> value"
    return fn


def _converter(tp: Any) -> tuple[Any, dict]:
    """(argparse ``type``, extra add_argument kwargs) for a field type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _converter(inner[0])
        words = [w for a in inner if typing.get_origin(a) is Literal for w in typing.get_args(a)]
        if int in inner and len(inner) == 2 and words:  # an integer or a word (env_workers: N or auto)
            return _named(lambda text: text if text in words else int(text), "integer or " + " or ".join(words)), {
                "metavar": "N|" + "|".join(words)
            }
        named = [a for a in inner if a in (str, Path)]
        if len(named) == 1:  # a name or an object (a spec's env, policy, critic): the flag takes the name
            return _converter(named[0])
    if origin is Literal:
        return type(args[0]), {"choices": list(args)}
    if tp is dict or origin is dict:
        return json_object, {"metavar": "JSON"}
    if origin is tuple:
        item = args[0] if args and args[0] in (int, float) else None
        if item is None:
            return _named(_comma_list, "list"), {"metavar": "A,B"}
        return _named(lambda text: tuple(item(x) for x in _comma_list(text)), f"{item.__name__} list"), {
            "metavar": "A,B"
        }
    if tp in (int, float, str, Path):
        return tp, {}
    raise TypeError(f"no command-line form for a field of type {tp!r}")


def _metavar(conv, name: str) -> str:
    return {int: "N", float: "X", Path: "PATH"}.get(conv, name.split("_")[-1].upper())


class Options:
    """The flags of one or more config dataclasses on one parser.

    Args:
        parser: the (sub)parser to add flags to.
    """

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self._flags: dict[str, argparse.Action] = {}  # field name -> its flag's action
        self._dest: dict[type, dict[str, str]] = {}

    def add(
        self,
        cls: type,
        flags: dict[str, str] | None = None,
        skip: tuple[str, ...] = (),
        help: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
    ) -> None:
        """Add one flag per field of ``cls`` (except ``skip``); ``flags`` renames, ``help`` overrides help.

        ``unset``: fields whose flag defaults to None (the command fills them in, e.g. from a recording) instead of the field's default.
        """
        flags, help = flags or {}, help or {}
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        dests = self._dest.setdefault(cls, {})
        doc = inspect.getdoc(cls) or ""
        if doc.startswith(cls.__name__ + "("):  # dataclass's generated signature, not a docstring anyone wrote
            doc = ""
        title = doc.splitlines()[0].rstrip(".") if doc else ""
        group = self.parser.add_argument_group(f"{title} ({cls.__name__})" if title else None)
        flag_of = {f.name: flags.get(f.name) or f.metadata.get("flag") or "--" + f.name.replace("_", "-") for f in dataclasses.fields(cls)}  # fmt: skip
        for f in dataclasses.fields(cls):
            if f.name in skip or not f.init:
                continue
            flag = flag_of[f.name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            text = plain(help.get(f.name, docs.get(f.name, "")), flag_of)
            if f.name in unset:
                default = None
            dest = f"{cls.__name__}.{f.name}"
            tp = hints[f.name]
            if tp is bool:
                action = group.add_argument(
                    flag, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=text
                )
            else:
                conv, extra = _converter(tp)
                if "choices" not in extra:
                    extra.setdefault("metavar", _metavar(conv, f.name))
                shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
                said = "default" in text.lower()  # the docstring already says what the default is
                suffix = "" if said or default is None or default == {} else f" (default: {shown})"
                action = group.add_argument(
                    flag, dest=dest, type=conv, default=default, help=(text + suffix).replace("%", "%%"), **extra
                )
            dests[f.name] = dest
            self._flags[f.name] = action

    def values(self, args: argparse.Namespace, cls: type) -> dict[str, Any]:
        """The parsed values of ``cls``'s fields, by field name."""
        return {name: getattr(args, dest) for name, dest in self._dest[cls].items()}

    def _action(self, field: str) -> argparse.Action | None:
        if field in self._flags:
            return self._flags[field]
        # an option the command declares itself (branch --chunk, replay --actors): its dest is the field's name
        return next((a for a in self.parser._actions if a.dest == field and a.option_strings), None)

    def flag(self, field: str) -> str | None:
        """The flag of a field name: a config field's, or an option of the parser with that dest (None: the command has none)."""
        action = self._action(field)
        return None if action is None else action.option_strings[0]

    def spell(self, text: str) -> str:
        """``text`` with each quoted field name written as this command's flag.

        A message quotes a field in backticks, `` `name` `` or `` `name=value` ``:
        `` `resume=True` `` becomes ``--resume``, `` `resume=False` `` ``--no-resume``,
        `` `actors=N` `` ``--actors N``. A name the command has no flag for is left as it is.
        """

        def one(m: re.Match) -> str:
            action = self._action(m["name"])
            if action is None:
                return m[0]
            flag = action.option_strings[0]
            if m["value"] is None:
                return flag
            if isinstance(action, argparse.BooleanOptionalAction) and m["value"] in ("True", "False"):
                return flag if m["value"] == "True" else "--no-" + flag[2:]
            return f"{flag} {m['value']}"

        return _QUOTED.sub(one, text)


def plain(text: str, flags: dict[str, str]) -> str:
    """A field docstring as ``--help`` shows it: a quoted field name as its flag (````name```` -> ``--name``), other
    literals unquoted, and a cross-reference (``:mod:`~a.b.c``` / ``:meth:`X.y```) as the name it shows."""
    text = _ROLE.sub(lambda m: m["target"].rsplit(".", 1)[-1] if m["tilde"] else m["target"], text)
    return _LITERAL.sub(lambda m: flags.get(m[1], m[1]), text)


_ROLE = re.compile(r":(?:mod|meth|func|class|attr|data):`(?P<tilde>~?)(?P<target>[^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_QUOTED = re.compile(r"`(?P<name>[a-z_][a-z0-9_]*)(?:=(?P<value>[^`]*))?`")


def parse_config(cls: type, argv: list[str] | None, prog: str, description: str, extra=(), skip=()):
    """A script's flags: one per field of the config dataclass ``cls`` (as the CLI's), plus ``extra``.

    ``extra``: ``(flags, add_argument kwargs)`` pairs (e.g. ``(("--out",), {"type": Path})``); ``skip``: fields
    with no flag. Returns ``(cls(...), the parsed namespace)``; a ``ValueError`` from ``cls`` exits 2 with its message.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    opts = Options(parser)
    opts.add(cls, skip=tuple(skip))
    for flags, kwargs in extra:
        parser.add_argument(*flags, **kwargs)
    args = parser.parse_args(argv)
    try:
        return cls(**opts.values(args, cls)), args
    except ValueError as err:
        parser.error(str(err))


def one_line_parser(description: str) -> argparse.ArgumentParser:
    """A training door's parser (``examples/dsrl.py``, ``examples/flow_rl.py``): the description kept as written, and
    every error one line on stderr (no usage block), exit 2."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(message: str):
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    parser.error = error
    return parser
