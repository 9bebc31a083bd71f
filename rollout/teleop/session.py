"""One teleop session: the bus, a key source, the status, the view, and the reset hook, wired together.

A driver (``rollcap run --teleop``) uses it like this::

    with open_teleop("keyboard") as tele:
        host = RolloutHost(env, policy, critic, config, [*subscribers, *tele.subscribers],
                           events=tele.bus, reset_hook=tele.reset_hook)
        index = 0
        while not tele.quit_requested:
            end = host.run_episode(index)
            if not end.dropped:          # a discarded episode is re-recorded under its index
                index += 1
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.teleop.keys import KeyController, TeleopKeys
from rollcap.rollout.teleop.keysource import KeySource
from rollcap.rollout.teleop.sources import open_key_source
from rollcap.rollout.teleop.status import TeleopStatus
from rollcap.rollout.teleop.view import LiveView, ViewConfig


@dataclass(frozen=True)
class TeleopConfig:
    """Options of a teleop session (``rollcap run --teleop ...``)."""

    source: str = "keyboard"
    """Where keys come from: ``keyboard`` (pynput under X, else the terminal), ``terminal`` or ``scripted:FILE``."""
    view: bool = True
    """Open the live view (off by itself without a display)."""
    countdown_s: int = 0
    """Seconds counted down after the go key before the next episode starts."""

    def __post_init__(self) -> None:
        if not isinstance(self.countdown_s, int) or not 0 <= self.countdown_s <= 60:
            raise ValueError(f"countdown_s: expected whole seconds in 0..60, got {self.countdown_s!r}")


class TeleopSession:
    """A key source, its controller, the status and the view around one :class:`EventBus`.

    Entering starts the source and the view; leaving stops both (the
    terminal mode is restored). Lifecycle: build, enter, hand :attr:`bus`,
    :attr:`subscribers` and :meth:`reset_hook` to a host, run episodes until
    :attr:`quit_requested`, leave.

    Args:
        source: the key source (not started; see :func:`open_key_source`).
        view: a live view, or None for none.
        countdown_s: seconds counted down after the go key.
        stream: where state changes and notices are printed (default stderr).
    """

    def __init__(self, source: KeySource, view: LiveView | None = None, countdown_s: int = 0, stream=None):
        self.bus = EventBus()
        self.source = source
        self.controller: KeyController = source.controller
        self.stream = stream or sys.stderr
        self.status = TeleopStatus(self.bus, self.controller, stream=self.stream)
        if self.controller.on_change is None:
            self.controller.on_change = self.status.refresh
        self.view = view
        if view is not None and view.status is None:
            view.status = self.status
        self.countdown_s = countdown_s

    @property
    def subscribers(self) -> list[Subscriber]:
        """Add these to the host: the controller (forgets a takeover at episode start), a scripted
        source (``step=N`` lines), the status, the view."""
        subs: list[Subscriber] = [self.controller]
        if isinstance(self.source, Subscriber):
            subs.append(self.source)
        subs.append(self.status)
        if self.view is not None:
            subs.append(self.view)
        return subs

    @property
    def quit_requested(self) -> bool:
        """The quit key was pressed: run no further episode."""
        return self.bus.quit_requested

    def wait_for_go(self) -> None:
        """Block until the go key (or quit), then count down; Ctrl-C interrupts the wait."""
        while not self.bus.wait_for_go(timeout=0.2):
            pass
        for left in range(self.countdown_s, 0, -1):
            if self.bus.quit_requested:
                break
            print(f"teleop: starting in {left}", file=self.stream, flush=True)
            time.sleep(1.0)

    def reset_hook(self, host) -> None:
        """The host's ``reset_hook`` in teleop mode: show ``awaiting reset`` and wait for the go key.

        Only a go key pressed from here on counts (one pressed while the episode ran is ignored: it
        would skip this reset); the bus awaits it before the state is shown, so no press is missed.
        """
        self.bus.expect_go()
        self.status.awaiting_reset()
        self.wait_for_go()

    def __enter__(self) -> TeleopSession:
        self.source.start(self.bus)
        try:
            if self.view is not None:
                self.view.start()
            print(f"teleop keys: {self.status.help}", file=self.stream, flush=True)
        except BaseException:
            self.source.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.source.stop()
        finally:
            if self.view is not None:
                self.view.stop()


def open_teleop(
    config: TeleopConfig | str = "keyboard", keys: TeleopKeys | None = None, stream=None, view: ViewConfig | None = None
) -> TeleopSession:
    """A :class:`TeleopSession` for ``config`` (or a source spec such as ``"terminal"``); enter it to start.

    Args:
        config: the session options, or just the key source spec.
        keys: the bindings.
        stream: where notices and state changes are printed (default stderr).
        view: options of the live view (when ``config.view``).
    """
    config = TeleopConfig(source=config) if isinstance(config, str) else config
    source = open_key_source(config.source, keys, stream=stream)
    live = LiveView(view, stream=stream) if config.view else None
    return TeleopSession(source, live, config.countdown_s, stream)
