"""Flags derived from config dataclasses: names, types, defaults, help from field docstrings, values back."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from rollcap.rollout.options import Options, field_docs


@dataclass(frozen=True)
class Toy:
    """A toy config."""

    max_chunks: int | None = None
    """Stop before this chunk."""
    beta: float = 1.5
    """Guidance weight."""
    out: Path = Path("runs")
    """Where to write."""
    backend: Literal["eager", "jit"] | None = None
    """Graph backend."""
    formats: tuple[str, ...] = ("npz", "h5")
    """Formats."""
    kwargs: dict | None = None
    """Env kwargs."""
    progress: bool = True
    """Show progress."""


def _parse(*argv):
    p = argparse.ArgumentParser(exit_on_error=False)
    opts = Options(p)
    opts.add(Toy, flags={"formats": "--format"})
    return opts, opts.values(p.parse_args(list(argv)), Toy), p


def test_defaults_types_and_names_come_from_the_dataclass():
    """Every field is a flag with the field's default; values convert to the field's type."""
    opts, v, _ = _parse()
    assert v == {
        "max_chunks": None,
        "beta": 1.5,
        "out": Path("runs"),
        "backend": None,
        "formats": ("npz", "h5"),
        "kwargs": None,
        "progress": True,
    }
    _, v, _ = _parse(
        "--max-chunks",
        "3",
        "--beta",
        "2",
        "--out",
        "x",
        "--backend",
        "jit",
        "--format",
        "npz",
        "--kwargs",
        '{"a": 1}',
        "--no-progress",
    )
    assert Toy(**v) == Toy(3, 2.0, Path("x"), "jit", ("npz",), {"a": 1}, False)
    assert opts.flag("formats") == "--format" and opts.flag("max_chunks") == "--max-chunks"


def test_help_is_the_field_docstring_with_the_default():
    """--help text is the docstring under each field, plus its default."""
    assert field_docs(Toy)["beta"] == "Guidance weight."
    *_, p = _parse()
    text = p.format_help()
    assert "Guidance weight. (default: 1.5)" in text and "A toy config (Toy)" in text


@pytest.mark.parametrize("argv", [["--beta", "x"], ["--backend", "tpu"], ["--kwargs", "[1]"], ["--kwargs", "{bad"]])
def test_bad_values_are_argparse_errors(argv):
    """A value of the wrong type is refused by the parser (one line through the CLI)."""
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse(*argv)


def test_every_flags_help_closes_its_parentheses():
    """No --help text of any command leaves a parenthesis open (replay's --policy once read '(.json or .safetensors. Default:')."""
    from rollcap.rollout.cli.commands import build_parser

    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parsers = [parser, *(p for s in subs for p in s.choices.values())]
    parsers += [
        q for p in parsers for s in p._actions if isinstance(s, argparse._SubParsersAction) for q in s.choices.values()
    ]
    bad = [
        (p.prog, a.option_strings, a.help)
        for p in parsers
        for a in p._actions
        if a.help and a.help.count("(") != a.help.count(")")
    ]
    assert len(parsers) > 5 and not bad, bad


def test_help_shows_field_names_as_flags_and_no_rest_markup():
    """A field docstring's ``name`` is the flag in --help, a cross-reference the name it shows; no reST is left."""
    from rollcap.rollout.options import plain

    flags = {"branches": "--branches", "keep_best": "--keep-best"}
    text = "With ``branches`` (see :mod:`~rollcap.rollout.learn.dsrl_branch` and :meth:`Host.start`); ``None``: off"
    assert plain(text, flags) == "With --branches (see dsrl_branch and Host.start); None: off"
    from rollcap.rollout.cli.commands import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        shown = parser.format_help()
        assert "``" not in shown and not re.search(r":(mod|meth|func|class|attr|data):`", shown), name


def test_a_fields_help_is_its_docstrings_first_paragraph():
    """--help shows a field docstring's first paragraph; what follows a blank line is the longer doc, left in the source."""

    @dataclass
    class Documented:
        steps: int = 4
        """Steps per chunk.

        A longer story about steps that --help leaves out."""

    assert field_docs(Documented) == {"steps": "Steps per chunk."}


def test_rollcap_run_help_is_one_short_line_a_flag():
    """Every field of ``rollcap run`` (Parts, RunConfig, HostConfig) has a help of at most 110 characters before the
    default argparse adds (a long doc stays in the field's docstring)."""
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.spec import Parts, RunConfig

    long = {
        f"{cls.__name__}.{name}": len(doc)
        for cls in (Parts, RunConfig, HostConfig)
        for name, doc in field_docs(cls).items()
        if len(doc) > 110
    }
    assert not long, long
