"""The OpenGL backend of MuJoCo's renderer, chosen before ``mujoco`` is imported when the user named none.

MuJoCo reads ``MUJOCO_GL`` once, when ``mujoco`` is imported. Unset, it is
GLFW, which needs a display and, on a thread other than the main one (where
rollcap's hosts step their envs), aborts the whole process from C++
(``libc++abi: __cxa_guard_acquire``) instead of raising. So importing this
module (``rollcap.envs`` does, before anything imports ``mujoco``) sets
``MUJOCO_GL`` when it is unset: ``egl`` where an EGL vendor library is
installed (a GPU driver's, or Mesa's ``libegl-mesa0``), else ``osmesa`` where
``libOSMesa`` is (``libosmesa6``), else nothing (GLFW, on a desktop).
Processes started later (Ray workers, writer processes) inherit it.

:func:`check_renderer` refuses, in one line naming ``MUJOCO_GL`` and before
anything renders, a backend that cannot work here (GLFW without a display, or
off the main thread).

A ``MUJOCO_GL`` that MuJoCo cannot even start with (a value it does not know,
``osmesa`` without libOSMesa, ``egl`` without libEGL) makes ``import mujoco``
itself raise, which would take every command down, ``--help`` and the built-in
task (rendered in numpy) included. So importing this module imports ``mujoco``
without GL in that case (:func:`vet`): physics works, and :func:`check_renderer`
refuses the backend in one line naming ``MUJOCO_GL`` when something would render.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
import threading
from pathlib import Path

from rollcap.envs.errors import RenderUnavailable

EGL_VENDOR_DIRS = ("/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d", "/usr/local/share/glvnd/egl_vendor.d")
"""Where libglvnd looks for EGL vendor libraries (``__EGL_VENDOR_LIBRARY_DIRS`` replaces them, as for libglvnd)."""

HOW = (
    "set MUJOCO_GL=egl (Debian: libegl1 libegl-mesa0) or MUJOCO_GL=osmesa (Debian: libosmesa6) before starting, "
    'or record without images (env kwargs {"render_images": false})'
)


def headless_backend() -> str | None:
    """``egl`` or ``osmesa`` when this machine has the libraries for it (EGL first), else None."""
    if not sys.platform.startswith("linux"):
        return None
    dirs = os.environ.get("__EGL_VENDOR_LIBRARY_DIRS")
    vendors = [p for d in (dirs.split(":") if dirs else EGL_VENDOR_DIRS) for p in Path(d).glob("*.json")]
    if vendors and ctypes.util.find_library("EGL"):
        return "egl"
    if ctypes.util.find_library("OSMesa"):
        return "osmesa"
    return None


def choose() -> str | None:
    """Set ``MUJOCO_GL`` to :func:`headless_backend` when it is unset and ``mujoco`` is not imported yet; returns what it is."""
    if "MUJOCO_GL" not in os.environ and "mujoco" not in sys.modules:
        gl = headless_backend()
        if gl is not None:
            os.environ["MUJOCO_GL"] = gl
    return os.environ.get("MUJOCO_GL")


_OFF = ("disable", "disabled", "off", "false", "0")
_KNOWN = ("enable", "enabled", "on", "true", "1", "glfw", "", "glx", "egl", "osmesa", *_OFF)
"""The values MuJoCo accepts on Linux (``mujoco/rendering/classic/gl_context.py``); any other makes its import raise."""

REFUSED: str | None = None
"""Why this process's ``MUJOCO_GL`` cannot render (set by :func:`vet`); None when it may."""


def unusable(gl: str) -> str | None:
    """Why ``import mujoco`` would fail with ``MUJOCO_GL=gl`` on this machine (a value MuJoCo does not know, a backend
    whose library is not installed); None when it can import (GLFW's display is :func:`check_renderer`'s job)."""
    if not sys.platform.startswith("linux"):
        return None
    value = gl.lower().strip()
    if value not in _KNOWN:
        return "MuJoCo knows egl, osmesa, glfw (or disabled), not this value"
    if value == "osmesa" and not ctypes.util.find_library("OSMesa"):
        return "libOSMesa is not installed (Debian: libosmesa6)"
    if value == "egl" and not ctypes.util.find_library("EGL"):
        return "libEGL is not installed (Debian: libegl1 libegl-mesa0)"
    return None


def vet() -> str | None:
    """Import ``mujoco`` without GL when ``MUJOCO_GL`` would make its import raise (see the module docstring); the
    environment keeps the user's value (processes started later vet it again). Returns :data:`REFUSED`."""
    global REFUSED
    gl = os.environ.get("MUJOCO_GL")
    if gl is None or "mujoco" in sys.modules or (why := unusable(gl)) is None:
        return REFUSED
    REFUSED = f"MUJOCO_GL={gl} cannot render here: {why}"
    os.environ["MUJOCO_GL"] = "disabled"
    try:
        import mujoco  # noqa: F401 - MuJoCo reads MUJOCO_GL once, as it is imported: physics only
    finally:
        os.environ["MUJOCO_GL"] = gl
    return REFUSED


def check_renderer() -> None:
    """Refuse a GL backend that cannot render here, before anything renders (a ``MUJOCO_GL`` MuJoCo could not start
    with, GLFW without a display or off the main thread).

    Raises:
        RenderUnavailable: naming ``MUJOCO_GL`` and how to set it.
    """
    if REFUSED is not None:
        raise RenderUnavailable(f"{REFUSED}; {HOW}")
    import mujoco

    context = getattr(mujoco, "GLContext", None)
    if context is None or getattr(context, "__module__", "").split(".")[-1] != "glfw":
        return  # egl / osmesa (or a platform's own): they raise a Python error when they cannot start
    gl = os.environ.get("MUJOCO_GL") or "<unset>"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise RenderUnavailable(f"MuJoCo's renderer uses GLFW (MUJOCO_GL={gl}), which needs a display; {HOW}")
    if threading.current_thread() is not threading.main_thread():
        raise RenderUnavailable(
            f"MuJoCo's renderer uses GLFW (MUJOCO_GL={gl}), which cannot render off the main thread; {HOW}"
        )


choose()
vet()
