"""Stopping a pynput X listener without an X error: the order in which its RECORD context is disabled and freed.

A pynput X listener records key events through a RECORD context: its thread
enables the context on one connection (which then stays busy until the
context is disabled), and frees it once the enable returns. pynput's own
``stop()`` clears ``running`` and asks that busy connection to disable the
context, which the server sees only with the next key event; that event ends
the listener, which then frees the context. A disable sent from elsewhere
after that free (a key-up still on its way when a run exits is enough) is
answered with ``BadRecordContext``, which python-xlib prints as an X protocol
error. :func:`stop_listener` disables the context first, from a fresh
connection, while the listener still runs: the listener frees it only once
its enable returns, which that disable makes happen, so no request can name a
freed context (the order python-xlib's ``record_demo`` uses).

Python-xlib is imported lazily (it comes with pynput).
"""

from __future__ import annotations


def stop_listener(listener, display: str, timeout_s: float = 1.0) -> None:
    """Stop a started pynput X ``listener`` on ``display`` (``":N"``) and wait for its thread to end.

    Single use, from any thread but the listener's. Without a connection of its
    own (the server is gone) it falls back to pynput's ``stop()``.
    """
    context = getattr(listener, "_context", None)
    ours = context is not None and listener.is_alive() and disable_context(display, context)
    if not ours:
        listener.stop()  # pynput's way: the next key event ends it
    listener.join(timeout_s)
    if ours and listener.is_alive():  # stopped right after it started: the disable came before its enable
        disable_context(display, context, quiet=True)  # it may be freeing the context now: no error then
        listener.join(timeout_s)


def disable_context(display: str, context: int, quiet: bool = False) -> bool:
    """Disable the RECORD ``context`` from a fresh connection to ``display`` and wait until the server has
    handled it; False if the display cannot be reached. ``quiet``: an X error in reply is not printed."""
    try:
        import Xlib.display

        conn = Xlib.display.Display(display)
    except Exception:  # noqa: BLE001 - the server is gone: so is the listener's connection
        return False
    try:
        if quiet:
            conn.set_error_handler(lambda err, request=None: None)
        conn.record_disable_context(context)
        conn.sync()  # a round trip: the server has handled the disable before we hang up
        conn.close()
        return True
    except Exception:  # noqa: BLE001 - the connection broke: the server is going away
        return False
