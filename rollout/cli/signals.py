"""How the ``rollcap`` command takes SIGINT and SIGTERM: held during start-up, acted on once, then ignored."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled on the same clean path as Ctrl-C."""


class _FirstSignal:
    """The first SIGINT / SIGTERM stops the command (KeyboardInterrupt / _Terminated); later ones are ignored.

    The command is already stopping then, and every stop path is bounded (a run
    drains its writer; see ``rollout.api``), so a second signal must not land
    in the middle of the clean-up and kill the process by signal.

    During start-up (imports, checkpoint loading, capture) the signal is held
    and acted on at :meth:`release`: raised inside a C extension's import it
    becomes ``ImportError: initialization failed``, and raised while C code
    runs Python it makes CPython end the process by SIGINT even after the
    exception was handled. Start-up takes a few seconds; Ctrl-C then stops at
    its end.
    """

    def __init__(self):
        self.seen = False
        self.held: int | None = None
        self.holding = True

    def __call__(self, signum, frame):
        if self.seen:
            return
        self.seen = True
        if self.holding:
            self.held = signum
            return
        self._raise(signum)

    def release(self) -> None:
        """Start-up is over: act on a held signal now, raise on later ones at once."""
        self.holding = False
        if self.held is not None:
            self._raise(self.held)

    def poll(self) -> None:
        """A safe point of start-up (pure Python, no import under way): act on a held signal now, keep holding otherwise."""
        if self.held is not None:
            self.release()

    def finish(self) -> None:
        """The work is done (every episode written): later signals are ignored, as after a first one."""
        self.seen = True

    @staticmethod
    def _raise(signum: int):
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


SIGNALS = _FirstSignal()
"""The process's one handler (installed by :func:`rollcap.rollout.cli.main`)."""
