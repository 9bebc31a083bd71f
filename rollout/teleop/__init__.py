"""Teleop: keys that stop, pause, label, discard, rewind and take over an episode, and a live view.

A person drives a running :class:`~rollcap.rollout.host.RolloutHost` only
through its :class:`~rollcap.rollout.events.EventBus`:

- :mod:`.keys`: :class:`TeleopKeys` (the bindings) and :class:`KeyController`
  (key down/up -> bus verbs; held movement keys -> an intervention action).
- :mod:`.sources`: where keys come from, behind one interface (``start(bus)``,
  ``stop()``): pynput under X, a raw-mode terminal reader, a script;
  :func:`open_key_source` picks one by name and falls back from the keyboard to
  the terminal with a one-line notice.
- :mod:`.xrecord`: stopping pynput's X listener in the order that leaves no
  X error (its RECORD context is disabled before the listener frees it).
- :mod:`.status`: :class:`TeleopStatus`, the live state and the key help line.
- :mod:`.view`: :class:`LiveView`, the scene, the planned chunk and the critic
  value in a window drawn on its own thread (off, saying so, without a display).
- :mod:`.session`: :class:`TeleopSession` wires these together for a driver
  (the bus, the subscribers, a reset hook that waits for the go key).
- :mod:`.rewind`: :class:`~.rewind.RewindBuffer`, the last boundaries of the live
  episode, and the retry from one of them (the ``b`` key).
- :mod:`.placement`: a run's episodes in a person's hands (``rollcap run --teleop``),
  one at a time in this process through the host's own driver.
- :mod:`.replay`: :class:`ReplayInputs` re-issues an episode's recorded takeover
  and stop, so closed-loop replay reproduces an intervened episode.
- :mod:`.bench`: key-to-effect latency through Xvfb and xdotool.

Imports point downward: ``keys`` <- ``sources`` (which also uses ``xrecord``),
``status`` <- ``session`` (which also uses ``view``); ``view``, ``replay`` and
``xrecord`` stand alone. They use the host's ``events``, ``protocols`` and
``episode`` only (``bench`` also builds a host), and nothing in
``rollcap.rollout`` below the API imports this package.
pynput and tkinter are imported lazily, when a source or the view starts;
importing this package costs only numpy and the host's own modules.
"""

from __future__ import annotations

from rollcap.rollout.teleop.keys import KeyController, TeleopKeys
from rollcap.rollout.teleop.replay import ReplayInputs
from rollcap.rollout.teleop.session import TeleopConfig, TeleopSession, open_teleop
from rollcap.rollout.teleop.sources import KeyboardSource, PynputSource, TerminalSource, open_key_source
from rollcap.rollout.teleop.keysource import KeySource, SourceUnavailable
from rollcap.rollout.teleop.scripted import ScriptedSource
from rollcap.rollout.teleop.status import TeleopStatus
from rollcap.rollout.teleop.view import LiveView, ViewConfig

__all__ = [
    "KeyController",
    "KeySource",
    "KeyboardSource",
    "LiveView",
    "PynputSource",
    "ReplayInputs",
    "ScriptedSource",
    "SourceUnavailable",
    "TeleopConfig",
    "TeleopKeys",
    "TeleopSession",
    "TeleopStatus",
    "TerminalSource",
    "ViewConfig",
    "open_key_source",
    "open_teleop",
]
