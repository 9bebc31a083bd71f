"""The ``rollcap`` command line: run, replay, inspect, branch, recap, bench, capsule inspect.

:func:`main` is the console script. The parser and the commands live in
:mod:`rollcap.rollout.cli.commands` (``branch`` in :mod:`~rollcap.rollout.cli.branch`,
``recap`` in :mod:`~rollcap.rollout.cli.recap`); flags come from the config
dataclasses through :mod:`~rollcap.rollout.options`.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import warnings

from rollcap.rollout.cli.signals import SIGNALS as _SIGNALS, Terminated as _Terminated


def main(argv: list[str] | None = None) -> int:
    """The ``rollcap`` command. Exit codes: 0 done, 1 a check failed, recording failed or the cluster did, 2 a user mistake,
    130 Ctrl-C (143 SIGTERM), always without a traceback for these."""
    signal.signal(signal.SIGINT, _SIGNALS)
    signal.signal(signal.SIGTERM, _SIGNALS)
    _unblock()
    warnings.showwarning = _show_warning
    try:
        return _main(argv)
    except _Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:  # e.g. during start-up: imports, capture
        print("interrupted", file=sys.stderr)
        return 130
    finally:  # exiting now: a late signal must not turn a clean exit into a death by signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _unblock() -> None:
    """Unblock SIGINT and SIGTERM, which ``import rollcap`` blocked for the command (its first lines): one sent
    meanwhile reaches the handler now, which holds it until start-up ends; processes started from here inherit no block."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _main(argv: list[str] | None) -> int:
    from rollcap.capsule.errors import CapsuleMismatch, CorruptCapsule
    from rollcap.kernels.errors import BadInput, CheckpointMismatch
    from rollcap.rollout.errors import ClusterFailure, ConfigError, CorruptEpisode, RecordingFailed

    from rollcap.rollout.options import UserError
    from rollcap.rollout.cli.commands import build_parser

    args = build_parser().parse_args(argv)  # imports what the command needs
    try:
        if args.command != "run":  # run releases once its parts are built
            _SIGNALS.release()
        return int(args.func(args) or 0)
    except ConfigError as err:  # its field as the flag, the fields it quotes as flags; a field with no flag here: the problem names the file
        opts = getattr(args, "options", None)
        flag = opts.flag(err.field) if opts is not None else None
        problem = opts.spell(err.problem) if opts is not None else err.problem
        print(f"rollcap {args.command}: error: {flag + ': ' if flag else ''}{problem}", file=sys.stderr)
        return 2
    except (RecordingFailed, ClusterFailure) as err:  # the disk or the machines, not the user: exit 1
        print(f"rollcap {args.command}: error: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError as err:
        if not _stdout_closed():  # another pipe (a process that died): a failure like any other
            print(f"rollcap {args.command}: error: {err}", file=sys.stderr)
            return 1
        os.dup2(
            os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno()
        )  # e.g. `rollcap inspect ... | head`: stop quietly
        return 0
    except (
        UserError,
        BadInput,
        CheckpointMismatch,
        CorruptEpisode,
        CorruptCapsule,
        CapsuleMismatch,
        ValueError,
        OSError,
    ) as err:
        print(f"rollcap {args.command}: error: {err}", file=sys.stderr)  # OSError: a missing or unreadable path
        return 2


def _stdout_closed() -> bool:
    """Whether this process's stdout is a pipe whose reader has gone (``| head`` that has read enough)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no stdout, or a file object without a descriptor
        return False


_SHOW = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """rollcap's own warnings as one line (``rollcap: warning: ...``); others as Python shows them."""
    from rollcap.envs.errors import MujocoWarning
    from rollcap.rollout.errors import ExportWarning, NotExactWarning

    if issubclass(category, (NotExactWarning, MujocoWarning, ExportWarning)):
        print(f"rollcap: warning: {message}", file=file or sys.stderr)
    else:
        _SHOW(message, category, filename, lineno, file, line)
