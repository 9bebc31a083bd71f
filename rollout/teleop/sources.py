"""Where teleop keys come from, behind one small interface.

A :class:`KeySource` is started with the bus to drive (``start(bus)``, which
returns the source, so ``with source.start(bus): ...`` works) and stopped with
``stop()``. Keys reach the bus through the source's :class:`KeyController`.

- :class:`PynputSource`: a pynput listener on the X display: real key down/up
  events, so movement keys count as held exactly while held down.
- :class:`TerminalSource`: stdin in raw (cbreak, no echo) mode, read on a
  background thread; for SSH, headless and Wayland sessions. A terminal
  sends no key-up, so a movement key counts as held for
  ``TeleopKeys.terminal_hold_s`` after each press (auto-repeat extends it).
  The terminal mode is restored on :meth:`~KeySource.stop`, when the reader
  fails, and at interpreter exit.
- :class:`ScriptedSource`: a file of ``WHEN KEY [down|up]`` lines or a list,
  for tests and batch runs.
- :class:`KeyboardSource`: pynput when it can work here, else the terminal,
  with a one-line notice saying why.
"""

from __future__ import annotations

import atexit
import difflib
import importlib.util
import os
import select
import sys
import termios
import threading
import time
from collections.abc import Callable

from rollcap.rollout.teleop.keys import TeleopKeys, key_name
from rollcap.rollout.teleop.xrecord import stop_listener

SOURCES = ("keyboard", "terminal", "scripted:FILE")
"""What :func:`open_key_source` accepts."""


from rollcap.rollout.teleop.keysource import KeySource, SourceUnavailable
from rollcap.rollout.teleop.scripted import ScriptedSource, ScriptLine, parse_script

__all__ = [
    "SOURCES",
    "KeySource",
    "SourceUnavailable",
    "ScriptLine",
    "ScriptedSource",
    "parse_script",
    "PynputSource",
    "TerminalSource",
    "KeyboardSource",
    "open_key_source",
    "parse_terminal",
    "x_display_problem",
]


# ---------------------------------------------------------------- pynput


def x_display_problem(environ=os.environ) -> str | None:
    """Why a pynput listener cannot see the keyboard here (None: an X display is set)."""
    if not environ.get("DISPLAY"):
        return "no X display ($DISPLAY unset)"
    if environ.get("WAYLAND_DISPLAY") or environ.get("XDG_SESSION_TYPE") == "wayland":
        return "a Wayland session (pynput would see only X11 windows' keys)"
    return None


def _pynput_name(key) -> str | None:
    char = getattr(key, "char", None)
    name = char if char is not None else getattr(key, "name", None)
    if name is None:
        return None
    try:
        return "space" if name == " " else key_name(name)
    except ValueError:
        return None


class PynputSource(KeySource):
    """Keys from the X display through a pynput listener (key down and up; all windows).

    Args:
        ready_timeout_s: how long to wait for the listener to come up.
    """

    name = "keyboard"

    def __init__(self, *args, ready_timeout_s: float = 5.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.ready_timeout_s = ready_timeout_s
        self._listener = None

    def _start(self) -> None:
        problem = x_display_problem()
        if problem is not None:
            raise SourceUnavailable(problem)
        if importlib.util.find_spec("pynput") is None:
            raise SourceUnavailable("pynput is not installed (pip install 'rollcap[teleop]')")
        try:
            from pynput import keyboard  # raises without a reachable X display
        except Exception as err:
            raise SourceUnavailable(
                f"pynput cannot reach the X display {os.environ.get('DISPLAY')!r} ({type(err).__name__})"
            ) from err
        listener = keyboard.Listener(on_press=self._on_press, on_release=self._on_release)
        listener.start()
        ready = threading.Thread(target=listener.wait, daemon=True)
        ready.start()
        ready.join(self.ready_timeout_s)
        if ready.is_alive() or not listener.is_alive():
            listener.stop()
            raise SourceUnavailable(
                f"pynput's listener did not start within {self.ready_timeout_s:g} s (does the X server have the RECORD extension?)"
            )
        self._listener, self._display = listener, os.environ["DISPLAY"]

    def _stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        stop_listener(listener, self._display)

    def _on_press(self, key) -> None:
        name = _pynput_name(key)
        if name is not None and self._listener is not None:
            self.controller.press(name)

    def _on_release(self, key) -> None:
        name = _pynput_name(key)
        if name is not None and self._listener is not None:
            self.controller.release(name)


# ---------------------------------------------------------------- terminal

_ESCAPES = {b"A": "up", b"B": "down", b"C": "right", b"D": "left"}
_CONTROL = {b"\r": "enter", b"\n": "enter", b" ": "space", b"\t": "tab", b"\x7f": "backspace", b"\x08": "backspace"}


def parse_terminal(data: bytes) -> list[str]:
    """Key names in bytes read from a terminal (arrows: ``ESC [ A`` or ``ESC O A``; unknown bytes are skipped)."""
    keys, i = [], 0
    while i < len(data):
        b = data[i : i + 1]
        if b == b"\x1b":
            if data[i + 1 : i + 2] in (b"[", b"O") and i + 2 < len(data):
                j = i + 2
                while j < len(data) and not 0x40 <= data[j] <= 0x7E:  # parameters, up to the final byte
                    j += 1
                name = _ESCAPES.get(data[j : j + 1]) if j == i + 2 else None
                if name:
                    keys.append(name)
                i = j + 1
                continue
            keys.append("esc")
        elif b in _CONTROL:
            keys.append(_CONTROL[b])
        elif 0x21 <= data[i] <= 0x7E:
            keys.append(b.decode().lower())
        i += 1
    return keys


class TerminalSource(KeySource):
    """Keys typed into a terminal (stdin by default), read on a background thread.

    A tty is put in cbreak mode without echo (Ctrl-C still interrupts) and
    restored on :meth:`stop`, when the reader thread fails, and at interpreter
    exit. Input that is not a tty (a pipe) is read as it is, up to its end.

    Args:
        fd: the file descriptor to read (default: stdin's).
    """

    name = "terminal"

    def __init__(self, *args, fd: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fd = fd
        self.error: BaseException | None = None
        """What ended the reader thread early, if anything did."""
        self._saved = None
        self._restore_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None

    def _start(self) -> None:
        try:
            fd = sys.stdin.fileno() if self.fd is None else self.fd
            os.fstat(fd)
        except (AttributeError, ValueError, OSError) as err:
            raise SourceUnavailable(f"no terminal to read keys from (stdin: {err})") from err
        self._fd = fd
        if os.isatty(fd):
            self._saved = termios.tcgetattr(fd)
            raw = termios.tcgetattr(fd)
            raw[3] &= ~(termios.ICANON | termios.ECHO)
            raw[6][termios.VMIN], raw[6][termios.VTIME] = 1, 0
            atexit.register(self._restore)
            termios.tcsetattr(fd, termios.TCSANOW, raw)
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._loop, name="rollcap-teleop-terminal", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        if self._thread is not None:
            self._thread.join(2.0)
        self._restore()
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def _restore(self) -> None:
        with self._restore_lock:
            saved, self._saved = self._saved, None
            if saved is not None:
                atexit.unregister(self._restore)
                try:
                    termios.tcsetattr(self._fd, termios.TCSANOW, saved)
                except termios.error:  # the terminal is gone
                    pass

    def _loop(self) -> None:
        ctl, hold = self.controller, self.keys.terminal_hold_s
        moving = self.keys.movement_keys
        until: dict[str, float] = {}  # movement key -> when its hold ends
        try:
            while True:
                timeout = max(0.0, min(until.values()) - time.perf_counter()) if until else None
                ready, _, _ = select.select([self._fd, self._wake[0]], [], [], timeout)
                if self._wake[0] in ready:
                    return
                if self._fd in ready:
                    data = os.read(self._fd, 256)
                    if not data:
                        return
                    for key in parse_terminal(data):
                        if key in moving:
                            if key not in until:
                                ctl.press(key)
                            until[key] = time.perf_counter() + hold
                        else:
                            ctl.tap(key)
                now = time.perf_counter()
                for key in [k for k, t in until.items() if t <= now]:
                    del until[key]
                    ctl.release(key)
        except BaseException as err:  # noqa: BLE001 - kept for the driver; the terminal is restored below
            self.error = err
        finally:
            self._restore()


# ---------------------------------------------------------------- keyboard (with fallback)


class KeyboardSource(KeySource):
    """The keyboard through pynput when it can work here; else the terminal.

    The fallback prints one line to ``stream`` saying why (e.g. ``teleop: no X
    display ($DISPLAY unset); reading keys from the terminal``).
    """

    name = "keyboard"

    def __init__(self, *args, stream=None, terminal_fd: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stream = stream
        self.terminal_fd = terminal_fd
        self.active: KeySource | None = None
        """The source in use once started (a :class:`PynputSource` or a :class:`TerminalSource`)."""
        self.notice: str | None = None
        """The fallback notice, when there was one."""

    def _start(self) -> None:
        bus = self.controller.bus
        try:
            self.active = PynputSource(controller=self.controller).start(bus)
        except SourceUnavailable as err:
            self.notice = f"teleop: {err}; reading keys from the terminal"
            print(self.notice, file=self.stream or sys.stderr, flush=True)
            self.active = TerminalSource(controller=self.controller, fd=self.terminal_fd).start(bus)

    def _stop(self) -> None:
        if self.active is not None:
            self.active.stop()


def open_key_source(
    name: str, keys: TeleopKeys | None = None, on_change: Callable[[], None] | None = None, stream=None
) -> KeySource:
    """The key source named by ``name``: ``keyboard``, ``terminal`` or ``scripted:FILE`` (not started yet).

    Args:
        keys: the bindings.
        on_change: called after every verb, on the source's thread.
        stream: where ``keyboard`` prints its fallback notice (default stderr).
    """
    if name == "keyboard":
        return KeyboardSource(keys, on_change, stream=stream)
    if name == "terminal":
        return TerminalSource(keys, on_change)
    if name.startswith("scripted:") and len(name) > len("scripted:"):
        return ScriptedSource(name[len("scripted:") :], keys, on_change)
    near = difflib.get_close_matches(name, SOURCES, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"teleop source: expected one of {', '.join(SOURCES)}, got {name!r}{hint}")
