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


def check_renderer() -> None:
    """Refuse a GL backend that cannot render here, before anything renders (GLFW without a display or off the main thread).

    Raises:
        RenderUnavailable: naming ``MUJOCO_GL`` and how to set it.
    """
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
