"""``rollcap capsule inspect PATH``: print a disk capsule's manifest and check its digest.

The ``rollcap`` command (:mod:`rollcap.rollout.cli.commands`) registers this through
:func:`add_subparser`; :func:`inspect_main` runs it standalone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from rollcap.capsule.errors import CapsuleError


def _clip(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _utc(wall_time: float) -> str:
    """``2024-05-01T12:00:00Z``; ``-`` for 0; the number itself when no calendar holds it."""
    if not wall_time:
        return "-"
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_time))
    except (OverflowError, OSError, ValueError):
        return f"{wall_time!r} s (past any calendar date)"


def _inspect(path: str) -> tuple[str, str | None]:
    """The report and, if the bytes check failed, why (``None`` when OK)."""
    from rollcap.capsule.disk import load, read_manifest  # (safetensors, torch): not for building the parser

    m = read_manifest(path)
    try:
        load(m.path)
        failure = None
    except CapsuleError as err:
        failure = str(err)
    b = m.boundary
    when = _utc(b.wall_time)
    parts = [f"label={b.label!r}"]
    parts += [
        f"{k}={v}"
        for k, v in (("episode", b.episode), ("chunk", b.chunk), ("step", b.step), ("branch", b.branch))
        if v is not None
    ]
    parts.append(f"wall_time={when}")
    lines = [
        f"capsule   {m.path}",
        f"format    rollcap-capsule v{m.format_version}",
        f"boundary  {' '.join(parts)}",
        f"bytes     {m.nbytes}",
        f"digest    {m.digest}  {'OK' if failure is None else 'FAILED'}",
    ]
    if b.extra:
        lines.insert(3, f"extra     {_clip(repr(dict(b.extra)))}")
    for comp, infos in m.specs.items():
        nbytes = sum(i.nbytes for i in infos.values())
        lines.append(f"component {comp}  ({len(infos)} buffers, {nbytes} bytes)")
        lines.append("  fingerprint")
        for key in sorted(m.fingerprints[comp]):
            lines.append(f"    {key}: {_clip(repr(m.fingerprints[comp][key]))}")
        lines.append("  buffers")
        width = max((len(n) for n in infos), default=0)
        for name, i in infos.items():
            shape = "[" + ", ".join(map(str, i.shape)) + "]"
            lines.append(f"    {name:<{width}}  {i.dtype:<8} {shape:<14} {i.nbytes:>10} B  {i.kind:<5}  {i.device}")
    if failure is not None:
        lines.append(f"FAILED: {failure}")
    return "\n".join(lines), failure


def format_manifest(path: str) -> str:
    """A readable report of the capsule at ``path``: components, buffers, fingerprints, digest OK/FAILED.

    Raises:
        CorruptCapsule: there is no readable manifest at ``path``.
    """
    return _inspect(path)[0]


def _run_inspect(args: argparse.Namespace) -> int:
    """Handler of ``capsule inspect``: 0 if the capsule checks out, 2 otherwise (one line on stderr)."""
    try:
        text, failure = _inspect(args.path)
    except CapsuleError as err:
        print(f"rollcap capsule inspect: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"rollcap capsule inspect: {args.path}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(text)
    if failure is not None:
        print(f"rollcap capsule inspect: digest check FAILED: {failure}", file=sys.stderr)
        return 2
    return 0


def add_subparser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``capsule inspect PATH`` on an argparse subparsers object; returns the ``inspect`` parser.

    Given the top-level subparsers of ``rollcap`` it adds ``capsule`` with
    ``inspect`` under it; given the subparsers of an existing ``capsule``
    command (``rollcap capsule ...``) it adds only ``inspect``. The handler is
    stored as ``func`` on the namespace: ``args.func(args)`` returns the exit
    code (0 ok, 2 bad or corrupt capsule, with one line on stderr).
    """
    prefix = getattr(subparsers, "_prog_prefix", "")  # "rollcap capsule" when nested
    if prefix.split()[-1:] == ["capsule"] or getattr(subparsers, "dest", None) == "capsule_command":
        verbs = subparsers
    else:
        capsule = subparsers.add_parser(
            "capsule", help="inspect execution-state capsules", description="Inspect execution-state capsules."
        )
        verbs = capsule.add_subparsers(dest="capsule_command", metavar="COMMAND", required=True)
    inspect = verbs.add_parser("inspect", help="print a disk capsule's manifest and check its digest")
    inspect.add_argument("path", metavar="PATH", help="a capsule directory (manifest.json + tensors.safetensors)")
    inspect.set_defaults(func=_run_inspect, subparser=inspect)
    return inspect


def inspect_main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``inspect_main(["PATH"])`` -> exit code."""
    parser = argparse.ArgumentParser(
        prog="rollcap capsule inspect", description="Print a disk capsule's manifest and check its digest."
    )
    parser.add_argument("path", metavar="PATH")
    return _run_inspect(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(inspect_main())
