"""Which key does what, and the controller that turns key presses into event-bus verbs.

Keys are named canonically: one lowercase printable character (``"e"``,
``"w"``), or one of :data:`SPECIAL_KEYS` (``"up"``, ``"space"``, ``"enter"``,
...). Every source (pynput, the terminal, a script) reports keys by these
names, so one :class:`TeleopKeys` serves them all.
"""

from __future__ import annotations

import dataclasses
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import EpisodeStart, Subscriber

SPECIAL_KEYS = ("up", "down", "left", "right", "space", "enter", "esc", "tab", "backspace")
"""Key names besides single printable characters."""

VERBS = ("end", "pause", "success", "failure", "discard", "quit", "go", "takeover", "rewind")
"""The :class:`TeleopKeys` fields that name a bus verb (in help-line order)."""

_DIRECTIONS = ("up", "down", "left", "right")
_PRINTABLE = set(string.printable) - set(string.whitespace) - set(string.ascii_uppercase)
_HELP = {
    "end": "end",
    "pause": "pause",
    "success": "success",
    "failure": "failure",
    "discard": "re-record",
    "quit": "quit",
    "go": "next episode",
    "takeover": "take over",
    "rewind": "rewind",
}


def key_name(key: str) -> str:
    """The canonical name of ``key`` (upper-case letters fold to lower case); ValueError if unknown."""
    name = key.lower() if len(key) == 1 else key
    if name in SPECIAL_KEYS or name in _PRINTABLE:
        return name
    raise ValueError(f"unknown key {key!r}: expected one printable character or one of {SPECIAL_KEYS}")


@dataclass(frozen=True)
class TeleopKeys:
    """The teleop key bindings (each field: the keys bound to it; ``()`` unbinds it).

    Every verb has a letter key: a terminal sends arrows and Enter as escape
    sequences or line ends, and some keyboards lack them, so arrows are
    aliases of WASD and Enter of ``g``.
    """

    end: tuple[str, ...] = ("e",)
    """End the episode now (stop reason ``keyboard``; no further chunk is launched)."""
    pause: tuple[str, ...] = ("p", "space")
    """Pause / resume (toggle): nothing is stepped or launched while paused."""
    success: tuple[str, ...] = ("y",)
    """Label the running episode a success (the recorded label)."""
    failure: tuple[str, ...] = ("n",)
    """Label the running episode a failure."""
    discard: tuple[str, ...] = ("r",)
    """Discard the running episode (it ends; nothing of it is recorded) to re-record it."""
    quit: tuple[str, ...] = ("q",)
    """Quit after the running episode (it still finishes and is recorded)."""
    go: tuple[str, ...] = ("g", "enter")
    """Start the next episode (while awaiting reset)."""
    takeover: tuple[str, ...] = ("t",)
    """Take over the arm / hand it back (toggle). While taken over, the movement keys drive it."""
    rewind: tuple[str, ...] = ("b",)
    """Rewind: end the episode (stop reason ``rewind``, recorded) and, after the go key, retry it from the
    boundary before the running chunk with new noise (a new episode; needs an env with exact state)."""
    up: tuple[str, ...] = ("up", "w")
    """Move up in the camera image (+y for the PushBlock pusher)."""
    down: tuple[str, ...] = ("down", "s")
    left: tuple[str, ...] = ("left", "a")
    right: tuple[str, ...] = ("right", "d")
    extra_movement: tuple[str, ...] = ()
    """More keys tracked as held movement keys, for an ``action_of`` hook (a gripper key, say)."""
    speed: float = 1.0
    """Per-axis magnitude of the default action (PushBlock: velocity in units of ``max_speed``)."""
    action_of: Callable[[frozenset[str]], np.ndarray] | None = None
    """Mapping hook: the set of held movement keys (canonical names) -> the action to apply.
    None: :meth:`pusher_velocity`, a 2-D velocity. Called on a source's thread: keep it cheap."""
    terminal_hold_s: float = 0.5
    """A terminal sends no key-up: each movement key press counts as held this long (holding the
    key down auto-repeats and keeps it held; a terminal's repeat delay is about 0.5 s)."""

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for f in (*VERBS, *_DIRECTIONS, "extra_movement"):
            value = getattr(self, f)
            if isinstance(value, str):
                raise ValueError(
                    f"TeleopKeys.{f}: expected a tuple of key names, got the string {value!r} (write ({value!r},))"
                )
            names = tuple(key_name(k) for k in value)
            for k in names:
                if k in seen and seen[k] != f:
                    raise ValueError(
                        f"TeleopKeys.{f}: key {k!r} is already bound to {seen[k]!r}; bind each key to one thing"
                    )
                seen[k] = f
            object.__setattr__(self, f, names)
        if not 0 < self.speed <= 1:
            raise ValueError(f"TeleopKeys.speed: expected a value in (0, 1], got {self.speed!r}")
        if self.action_of is not None and not callable(self.action_of):
            raise ValueError(f"TeleopKeys.action_of: expected a callable or None, got {self.action_of!r}")
        if not self.terminal_hold_s > 0:
            raise ValueError(f"TeleopKeys.terminal_hold_s: expected seconds > 0, got {self.terminal_hold_s!r}")

    @property
    def movement_keys(self) -> frozenset[str]:
        """Keys whose down/up state is tracked (directions and ``extra_movement``)."""
        return frozenset((*self.up, *self.down, *self.left, *self.right, *self.extra_movement))

    def verb_of(self, key: str) -> str | None:
        """The verb (a name in :data:`VERBS`) bound to ``key``, or None."""
        return next((v for v in VERBS if key in getattr(self, v)), None)

    def pusher_velocity(self, held: frozenset[str]) -> np.ndarray:
        """The default mapping: a 2-D velocity ``[x, y]`` in [-1, 1] from the held direction keys."""

        def axis(pos, neg):
            return self.speed * (bool(held & set(pos)) - bool(held & set(neg)))

        return np.array([axis(self.right, self.left), axis(self.up, self.down)], dtype=np.float32)

    def action(self, held: frozenset[str]) -> np.ndarray:
        """The action for the held movement keys (through ``action_of`` when set)."""
        return np.asarray(
            self.pusher_velocity(held) if self.action_of is None else self.action_of(held), dtype=np.float32
        )

    def help_line(self) -> str:
        """One line of key help for display, e.g. ``e end · p/space pause · ... · arrows/wasd move``."""
        parts = [f"{'/'.join(getattr(self, v))} {_HELP[v]}" for v in VERBS if getattr(self, v)]
        moves = [k for d in ("up", "left", "down", "right") for k in getattr(self, d)]  # reads "wasd"
        arrows = [k for k in moves if k in _DIRECTIONS]
        letters = "".join(k for k in moves if k not in _DIRECTIONS)
        move = "/".join(x for x in ("arrows" if len(arrows) == 4 else " ".join(arrows), letters) if x)
        if move:
            parts.append(f"{move} move")
        return " · ".join(parts)

    def replace(self, **changes) -> TeleopKeys:
        """A copy with fields replaced (validated again)."""
        return dataclasses.replace(self, **changes)


class KeyController(Subscriber):
    """Turns key presses and releases into :class:`EventBus` verbs.

    ``press`` / ``release`` may be called from any thread (a listener's, a
    terminal reader's); the verbs are thread-safe. A press of a key already
    held (keyboard auto-repeat) repeats nothing. While taken over, every
    change of the held movement keys sets ``bus.intervene(action)`` (no key
    held: a zero action, the arm held still); handing back sets ``None``.

    It is also a :class:`Subscriber`: an episode starts with the policy in
    control (the host clears the bus), so ``on_episode_start`` forgets a takeover.

    Args:
        keys: the bindings.
        on_change: called (on the source's thread) after every verb, e.g. to refresh a status line.
    """

    def __init__(self, keys: TeleopKeys | None = None, on_change: Callable[[], None] | None = None):
        self.keys = keys or TeleopKeys()
        self.bus: EventBus | None = None
        self.on_change = on_change
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._taken = False
        self.label: bool | None = None
        """The label keyed in the running episode (True success, False failure), None if none yet."""
        self.last_press: tuple[str, float] | None = None
        """The last key pressed and its ``time.perf_counter()`` (for latency measurements)."""

    def attach(self, bus: EventBus) -> None:
        """Send verbs to ``bus`` from now on."""
        self.bus = bus

    @property
    def intervening(self) -> bool:
        """True while the human has taken over."""
        return self._taken

    @property
    def held(self) -> frozenset[str]:
        """The movement keys held down now."""
        return frozenset(self._held)

    def press(self, key: str) -> None:
        """A key went down (canonical name, see :func:`key_name`)."""
        if self.bus is None:
            raise RuntimeError("KeyController: attach(bus) first (a source's start(bus) does)")
        t = time.perf_counter()
        with self._lock:
            self.last_press = (key, t)
            if key in self.keys.movement_keys:
                if key in self._held:
                    return
                self._held.add(key)
                self._steer()
            else:
                if key in self._held:  # auto-repeat of a held verb key
                    return
                self._held.add(key)
                self._verb(self.keys.verb_of(key))
        if self.on_change is not None:
            self.on_change()

    def release(self, key: str) -> None:
        """A key went up."""
        with self._lock:
            if key not in self._held:
                return
            self._held.discard(key)
            if key in self.keys.movement_keys:
                self._steer()

    def tap(self, key: str) -> None:
        """A press followed by a release."""
        self.press(key)
        self.release(key)

    def on_episode_start(self, start: EpisodeStart) -> None:
        with self._lock:
            self._taken = False
            self.label = None
            if self.bus is not None:
                self.bus.intervene(None)  # a takeover keyed while the host was starting is dropped too

    # -- private (under the lock) ---------------------------------------------
    def _steer(self) -> None:
        if self._taken:
            self.bus.intervene(self.keys.action(frozenset(self._held & self.keys.movement_keys)))

    def _verb(self, verb: str | None) -> None:
        bus = self.bus
        if verb == "end":
            bus.request_stop("keyboard")
        elif verb == "pause":
            bus.pause()
        elif verb in ("success", "failure"):
            self.label = verb == "success"
            bus.mark(self.label)
        elif verb == "discard":
            bus.discard()
        elif verb == "quit":
            bus.quit()
        elif verb == "go":
            bus.go()
        elif verb == "rewind":
            bus.request_stop("rewind")  # rollcap.rollout.teleop.rewind.REWIND; the run loop starts the retry
        elif verb == "takeover":
            self._taken = not self._taken
            if self._taken:
                self._steer()
            else:
                bus.intervene(None)
