"""Top-down renderers of the PushBlock scene.

:class:`NumpyRenderer` (the default) draws the scene with numpy only: no
OpenGL, no system packages, deterministic bit-for-bit, ~0.05 ms per 64x64
frame. :class:`MujocoRenderer` uses MuJoCo's OpenGL renderer through the
scene's orthographic ``front`` camera; it needs a headless GL backend chosen
*before* ``mujoco`` is imported: ``MUJOCO_GL=egl`` (Debian package
``libegl1``, plus a GPU or Mesa's ``libegl-mesa0``) or ``MUJOCO_GL=osmesa``
(Debian package ``libosmesa6``). Both are single-threaded objects: use one
per env.
"""

from __future__ import annotations

import math
import os

import mujoco
import numpy as np

from rollcap.envs.errors import RenderUnavailable
from rollcap.envs.gl import check_renderer
from rollcap.envs.scene import SceneSpec


def _u8(rgb: tuple[float, float, float]) -> np.ndarray:
    return np.array([round(255 * c) for c in rgb], dtype=np.uint8)


class NumpyRenderer:
    """Orthographic top-down rasteriser of the scene at ``size`` x ``size`` pixels.

    A pixel takes the colour of the topmost shape containing its centre
    (targets < blocks < pusher); blocks (pucks) and the pusher are discs.
    """

    def __init__(self, spec: SceneSpec, size: int) -> None:
        if size < 8:
            raise ValueError(f"image size must be >= 8 pixels, got {size}")
        self.spec, self.size = spec, size
        t = spec.table_half
        self._px = 2 * t / size  # metres per pixel
        centres = (np.arange(size, dtype=np.float64) + 0.5) * self._px
        self._xs = centres - t  # world x of each column's centre
        self._ys = t - centres  # world y of each row's centre
        self._block_rgb = [_u8(c) for c in spec.block_rgb]
        self._pusher_rgb = _u8(spec.pusher_rgb)
        bg = np.empty((size, size, 3), dtype=np.uint8)
        bg[:] = _u8(spec.table_rgb)
        for tx, ty in spec.target_xy:
            self._disc(bg, tx, ty, spec.target_radius, _u8(spec.target_rgb))
        self._background = bg

    def _window(self, x: float, y: float, r: float) -> tuple[int, int, int, int]:
        t, px, n = self.spec.table_half, self._px, self.size
        c0 = max(0, math.floor((x - r + t) / px))
        c1 = min(n, math.ceil((x + r + t) / px))
        r0 = max(0, math.floor((t - y - r) / px))
        r1 = min(n, math.ceil((t - y + r) / px))
        return r0, r1, c0, c1

    def _disc(self, img: np.ndarray, x: float, y: float, r: float, rgb: np.ndarray) -> None:
        r0, r1, c0, c1 = self._window(x, y, r)
        if r0 >= r1 or c0 >= c1:
            return
        dx = self._xs[c0:c1] - x
        dy = self._ys[r0:r1] - y
        mask = dx[None, :] ** 2 + dy[:, None] ** 2 <= r * r
        img[r0:r1, c0:c1][mask] = rgb

    def render(self, qpos: np.ndarray) -> np.ndarray:
        """Return a new uint8 ``(size, size, 3)`` image of the scene at ``qpos``.

        Args:
            qpos: the model's qpos: pusher x, y, then x, y, yaw per block (a puck looks
                the same at every yaw).
        """
        q = qpos.tolist()
        img = self._background.copy()
        for i, rgb in enumerate(self._block_rgb):
            self._disc(img, q[2 + 3 * i], q[3 + 3 * i], self.spec.block_radius, rgb)
        self._disc(img, q[0], q[1], self.spec.pusher_radius, self._pusher_rgb)
        return img


class MujocoRenderer:
    """MuJoCo's OpenGL renderer through a named camera, on a private ``MjData``.

    Rendering copies ``qpos`` (and the mocap bodies' poses, when given) into
    its own data and runs ``mj_kinematics`` and ``mj_camlight`` there, so it
    never touches the simulation's data (exactness is unaffected) and an image
    is a function of the state alone. The GL context is created on first use.
    ``shadows=False`` skips the shadow pass (with a software GL, most of a
    frame's cost in a scene of many meshes).
    """

    def __init__(self, model: mujoco.MjModel, size: int, camera: str = "front", shadows: bool = True) -> None:
        check_renderer()  # a GL backend that cannot work here is named now, before anything renders
        self.model, self.size, self.camera, self.shadows = model, size, camera, shadows
        self._data = mujoco.MjData(model)
        self._renderer: mujoco.Renderer | None = None

    def _ensure(self) -> mujoco.Renderer:
        if self._renderer is None:
            check_renderer()  # on the thread that renders (GLFW off the main thread aborts the process)
            try:
                self._renderer = mujoco.Renderer(self.model, self.size, self.size)
            except Exception as err:  # backend errors vary: ImportError, AttributeError, mujoco.FatalError
                gl = os.environ.get("MUJOCO_GL", "<unset>")
                raise RenderUnavailable(
                    f"MuJoCo renderer could not start (MUJOCO_GL={gl}): {err}. Set MUJOCO_GL=egl "
                    "(Debian: libegl1) or MUJOCO_GL=osmesa (Debian: libosmesa6) before importing "
                    "mujoco, or use renderer='numpy' which needs no OpenGL."
                ) from err
        return self._renderer

    def render(
        self, qpos: np.ndarray, mocap_pos: np.ndarray | None = None, mocap_quat: np.ndarray | None = None
    ) -> np.ndarray:
        """Return a new uint8 ``(size, size, 3)`` image of the scene at ``qpos`` (and the mocap poses)."""
        renderer = self._ensure()
        self._data.qpos[:] = qpos
        if mocap_pos is not None:
            self._data.mocap_pos[:] = mocap_pos
        if mocap_quat is not None:
            self._data.mocap_quat[:] = mocap_quat
        mujoco.mj_kinematics(self.model, self._data)
        mujoco.mj_camlight(self.model, self._data)
        renderer.update_scene(self._data, camera=self.camera)
        if not self.shadows:
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        return renderer.render().copy()

    def close(self) -> None:
        """Free the GL context; safe to call twice."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
