"""The key source interface: what every teleop key source (X keyboard, terminal, script) implements."""

from __future__ import annotations

from collections.abc import Callable
from rollcap.rollout.errors import RolloutError
from rollcap.rollout.events import EventBus
from rollcap.rollout.teleop.keys import KeyController, TeleopKeys


class SourceUnavailable(RolloutError):
    """A key source cannot work here; the message says why in a few words."""


class KeySource:
    """Delivers key presses to a :class:`KeyController`.

    Args:
        keys: the bindings (default :class:`TeleopKeys`).
        on_change: called after every verb (on the source's thread).
        controller: share an existing controller instead (``keys`` and ``on_change`` are then its own).
    """

    name = "source"

    def __init__(
        self,
        keys: TeleopKeys | None = None,
        on_change: Callable[[], None] | None = None,
        controller: KeyController | None = None,
    ):
        self.controller = controller or KeyController(keys, on_change)
        self.started = False

    @property
    def keys(self) -> TeleopKeys:
        return self.controller.keys

    def start(self, bus: EventBus) -> KeySource:
        """Begin delivering keys to ``bus``; raises :class:`SourceUnavailable` if this source cannot work here."""
        if self.started:
            raise RuntimeError(f"{type(self).__name__}: already started")
        self.controller.attach(bus)
        self._start()
        self.started = True
        return self

    def stop(self) -> None:
        """Stop delivering keys and release what the source holds (idempotent)."""
        if self.started:
            self.started = False
            self._stop()

    def __enter__(self) -> KeySource:
        if not self.started:
            raise RuntimeError(f"{type(self).__name__}: use `with source.start(bus):`")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError
