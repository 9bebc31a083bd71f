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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollcap.rollout.errors import RolloutError
from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import EpisodeStart, StepEvent, Subscriber
from rollcap.rollout.teleop.keys import KeyController, TeleopKeys, key_name
from rollcap.rollout.teleop.xrecord import stop_listener

SOURCES = ("keyboard", "terminal", "scripted:FILE")
"""What :func:`open_source` accepts."""


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


# ---------------------------------------------------------------- scripted


@dataclass(frozen=True)
class ScriptLine:
    """One scripted key event."""

    delay_s: float | None
    """Seconds after the previous line fired (None: a step trigger)."""
    step: int | None
    """Fire when the running episode has done this many env steps (on the host thread)."""
    key: str
    action: str
    """``tap``, ``down`` or ``up``."""


def parse_script(lines: Sequence[str], where: str = "script") -> list[ScriptLine]:
    """Parse ``WHEN KEY [down|up]`` lines (``#`` starts a comment).

    ``WHEN`` is seconds after the previous line fired (``0.5``), or
    ``step=N``: when the running episode has done ``N`` env steps (fired on
    the host's thread, before anything else happens: deterministic). A
    ``0`` line right after a step line fires with it, in the same hook. A
    timed go key (``0.05 g``) also waits until the host awaits reset, as a
    person does (the bus ignores a go key pressed while an episode runs).
    """
    out = []
    for n, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].split()
        if not text:
            continue
        try:
            if len(text) not in (2, 3) or (len(text) == 3 and text[2] not in ("down", "up")):
                raise ValueError("expected WHEN KEY [down|up]")
            when, key = text[0], key_name(text[1])
            if when.startswith("step="):
                step, delay = int(when[5:]), None
                if step < 0:
                    raise ValueError(f"step must be >= 0, got {step}")
            else:
                step, delay = None, float(when)
                if not delay >= 0:
                    raise ValueError(f"seconds must be >= 0, got {when}")
        except ValueError as err:
            raise ValueError(f"{where} line {n}: {raw.strip()!r}: {err}") from err
        out.append(ScriptLine(delay, step, key, text[2] if len(text) == 3 else "tap"))
    return out


class ScriptedSource(KeySource, Subscriber):
    """Keys from a script: a file of ``WHEN KEY [down|up]`` lines, or a list of such lines.

    Timed lines fire on the source's thread (a go key once the host also awaits
    reset); ``step=N`` lines fire inside the host's hooks, so add the source to
    the host's subscribers when the script uses them. Lines fire in order, each once.
    """

    name = "scripted"

    def __init__(self, script: str | Path | Sequence[str], *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(script, (str, Path)):
            path = Path(script)
            try:
                text = path.read_text().splitlines()
            except OSError as err:
                raise SourceUnavailable(f"cannot read the key script {str(path)!r}: {err.strerror}") from err
            self.lines = parse_script(text, str(path))
        else:
            self.lines = parse_script(list(script))
        self._cond = threading.Condition()
        self._next = 0
        self._last_fire = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def finished(self) -> bool:
        """Every line has fired."""
        return self._next >= len(self.lines)

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until every line has fired; True if it did."""
        with self._cond:
            return self._cond.wait_for(lambda: self.finished or self._stopping, timeout) and self.finished

    def _start(self) -> None:
        self._last_fire = time.perf_counter()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="rollcap-teleop-script", daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(2.0)

    def _fire(self) -> None:  # under the condition's lock
        line = self.lines[self._next]
        self._next += 1
        self._last_fire = time.perf_counter()
        {"tap": self.controller.tap, "down": self.controller.press, "up": self.controller.release}[line.action](
            line.key
        )
        self._cond.notify_all()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopping and not self.finished:
                line = self.lines[self._next]
                if line.delay_s is None:  # a step line: the host's hooks fire it
                    self._cond.wait()
                    continue
                due = self._last_fire + line.delay_s
                now = time.perf_counter()
                if now < due:
                    self._cond.wait(due - now)
                    continue
                if self._early_go(line):
                    self._cond.wait(0.01)  # the bus has no wake-up for this: look again shortly
                    continue
                self._fire()

    def _early_go(self, line: ScriptLine) -> bool:
        """A go key the bus would ignore now: the host does not await reset yet."""
        return line.action != "up" and self.keys.verb_of(line.key) == "go" and not self.controller.bus.awaiting_go

    def _at_step(self, done: int) -> None:
        if not self.started:
            return
        with self._cond:
            fired = False
            while not self.finished:
                line = self.lines[self._next]
                if line.step == done or (fired and line.delay_s == 0):
                    self._fire()
                    fired = True
                else:
                    break

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._at_step(0)

    def on_step(self, step: StepEvent) -> None:
        self._at_step(step.step + 1)


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


def open_source(
    spec: str, keys: TeleopKeys | None = None, on_change: Callable[[], None] | None = None, stream=None
) -> KeySource:
    """The key source named by ``spec``: ``keyboard``, ``terminal`` or ``scripted:FILE`` (not started yet).

    Args:
        keys: the bindings.
        on_change: called after every verb, on the source's thread.
        stream: where ``keyboard`` prints its fallback notice (default stderr).
    """
    if spec == "keyboard":
        return KeyboardSource(keys, on_change, stream=stream)
    if spec == "terminal":
        return TerminalSource(keys, on_change)
    if spec.startswith("scripted:") and len(spec) > len("scripted:"):
        return ScriptedSource(spec[len("scripted:") :], keys, on_change)
    near = difflib.get_close_matches(spec, SOURCES, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"teleop source: expected one of {', '.join(SOURCES)}, got {spec!r}{hint}")
