"""``rollcap/PushBlock-v0``: push the named coloured block to the named target.

A pusher disc on x/y slide joints, driven by velocity actuators, pushes one of
three round blocks (pucks: red, green, blue) to one of three target zones (left, middle,
right) on a table; the instruction names both, e.g. "push the red block to the
left target". Layout and task are drawn from the env's own
``np.random.Generator`` (seeded by ``reset(seed=...)``; never the global RNG).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from rollcap.envs.errors import BadAction, StateMismatch
from rollcap.envs.render import MujocoRenderer, NumpyRenderer
from rollcap.envs.scene import (
    BLOCKS,
    INSTRUCTION_CHARSET,
    MAX_INSTRUCTION_LEN,
    TARGETS,
    SceneSpec,
    load_model,
    make_instruction,
    xml_digest,
)
from rollcap.envs.state import (
    get_mj_state,
    rng_state_from_array,
    rng_to_array,
    set_mj_state,
    spec_of,
    spec_to_json,
    validate_state,
)

ENV_ID = "rollcap/PushBlock-v0"
CAMERAS = ("front",)
RENDERERS = ("numpy", "mujoco")
STATE_DIM = 4 + 4 * len(BLOCKS) + 4 * len(TARGETS)

# Episode phases, kept in the exact state.
_NEEDS_RESET, _RUNNING, _OVER = 0, 1, 2


MAX_IMAGE_SIZE = 1024
"""Largest camera side a PushBlock env renders (a 1024x1024 frame is 3 MiB; larger is a mistake, not a task)."""


def _is_int(x) -> bool:
    """An int that is not a bool (JSON's ``true`` would otherwise pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class PushBlockConfig:
    """Options of :class:`PushBlockEnv` (also accepted as ``gym.make`` keyword arguments)."""

    image_size: int = 64
    """Side of each observation image in pixels."""
    render_images: bool = True
    """Put ``image_<camera>`` keys in the observation; False skips rendering (faster)."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras to render into the observation; only ``"front"`` (top-down) exists."""
    renderer: str = "numpy"
    """``"numpy"`` (default, no OpenGL) or ``"mujoco"`` (needs ``MUJOCO_GL=egl|osmesa``)."""
    render_size: int = 256
    """Side of the image ``render()`` returns in ``render_mode="rgb_array"``."""
    max_steps: int = 120
    """Steps before the episode is truncated."""
    frame_skip: int = 10
    """MuJoCo substeps per env step (10 x 0.01 s = a 10 Hz control rate)."""
    max_speed: float = 0.2
    """Pusher speed in m/s per unit of action."""
    success_radius: float = 0.05
    """The block counts as on the target when its centre is this close (metres)."""
    scene: SceneSpec = field(default_factory=SceneSpec)
    """Geometry and colours."""
    block_velocity: bool = False
    """Also put ``block_velocity`` in the observation: per block (red, green, blue) its x, y velocity (m/s) and yaw
    rate (rad/s / 10), float32 ``(9,)`` clipped to [-1, 1]. ``state`` has the blocks' poses but not how they move, so
    at a chunk boundary mid-push it is not Markov; a critic or a noise agent can ask for this. No policy reads it."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.image_size, int)
            or isinstance(self.image_size, bool)
            or not 8 <= self.image_size <= MAX_IMAGE_SIZE
        ):
            raise ValueError(f"image_size must be an int in 8..{MAX_IMAGE_SIZE}, got {self.image_size!r}")
        if not _is_int(self.render_size) or self.render_size < 8:
            raise ValueError(f"render_size must be an int >= 8, got {self.render_size!r}")
        object.__setattr__(self, "cameras", tuple(self.cameras))
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad or not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"cameras must be distinct names from {CAMERAS}, got {self.cameras!r}")
        if self.renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS}, got {self.renderer!r}")
        if not _is_int(self.max_steps) or self.max_steps < 1:  # True is an int to Python: it was taken as 1 step
            raise ValueError(f"max_steps must be an int >= 1, got {self.max_steps!r}")
        if not _is_int(self.frame_skip) or self.frame_skip < 1:
            raise ValueError(f"frame_skip must be an int >= 1, got {self.frame_skip!r}")
        for name in ("max_speed", "success_radius"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(self.block_velocity, bool):
            raise ValueError(f"block_velocity must be True or False, got {self.block_velocity!r}")

    @classmethod
    def with_overrides(cls, base: PushBlockConfig | None = None, **overrides: Any) -> PushBlockConfig:
        """Return ``base`` (or the defaults) with fields replaced; unknown names get a suggestion."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in overrides:
            if key not in names:
                near = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise TypeError(f"PushBlockEnv got an unknown option {key!r}{hint}")
        return dataclasses.replace(base or cls(), **overrides)


class PushBlockEnv(gym.Env):
    """Push the block named by the instruction onto the named target.

    Actions: ``Box(-1, 1, (2,), float32)``, the pusher's x/y velocity in units
    of ``max_speed``. Non-finite values or a wrong shape raise
    :class:`~rollcap.envs.errors.BadAction` before the simulator is touched;
    finite out-of-range values are clipped to the box, and
    ``info["action_clipped"]`` / ``info["clip_count"]`` (clipped components
    this episode) report it.

    Observation (``Dict``): ``"state"`` float32 ``(28,)`` in [-1, 1] = pusher
    x, y (m), pusher vx, vy (m/s, clipped to [-1, 1]); then per block (red,
    green, blue) its x, y offset from the pusher (m), sin(yaw), cos(yaw); then
    per target (left, middle, right) its x, y offset from the pusher and its
    x, y (m). Offsets are egocentric, as robot proprio usually is;
    ``"image_front"`` uint8 ``(S, S, 3)`` top-down RGB (when ``render_images``);
    ``"instruction"`` a ``Text`` string. The state holds no task: only the
    instruction says which block and target.

    Reward: ``-d(block, target) - 0.25 * max(d(pusher, block) - contact, 0)``
    (metres; ``contact`` = block radius + pusher radius) plus 1.0 on the success step. The episode terminates on success
    (``info["is_success"]``) and truncates after ``max_steps`` steps; stepping
    an ended episode raises. Single-threaded; call ``reset()`` first.

    Exact state: ``get_state()`` / ``set_state()`` (see :meth:`get_state`)
    and the ``Stateful`` protocol of ``rollcap.capsule``.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    exact_state = True

    def __init__(self, render_mode: str | None = None, config: PushBlockConfig | None = None, **overrides: Any) -> None:
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.config = cfg = PushBlockConfig.with_overrides(config, **overrides)
        self.render_mode = render_mode
        self.model, self._xml = load_model(cfg.scene, cfg.max_speed)
        self._digest = xml_digest(self._xml)
        self.data = mujoco.MjData(self.model)
        self._image_renderers = {c: self._make_renderer(cfg.image_size, c) for c in cfg.cameras}
        self._frame_renderer = None
        self._targets = np.array(cfg.scene.target_xy, dtype=np.float64)

        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        obs = {"state": spaces.Box(-1.0, 1.0, shape=(STATE_DIM,), dtype=np.float32)}
        if cfg.block_velocity:
            obs["block_velocity"] = spaces.Box(-1.0, 1.0, shape=(3 * len(BLOCKS),), dtype=np.float32)
        if cfg.render_images:
            for cam in cfg.cameras:
                s = cfg.image_size
                obs[f"image_{cam}"] = spaces.Box(0, 255, shape=(s, s, 3), dtype=np.uint8)
        obs["instruction"] = spaces.Text(max_length=MAX_INSTRUCTION_LEN, min_length=1, charset=INSTRUCTION_CHARSET)
        self.observation_space = spaces.Dict(obs)

        self._task = (0, 0)
        self._instruction = make_instruction(0, 0)
        self._step = 0
        self._clip_count = 0
        self._phase = _NEEDS_RESET
        self._state_spec = spec_of(self.get_state())

    # ----------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode; ``options`` may force ``{"block": name|idx, "target": name|idx}``.

        The task is always drawn first, then the layout, so forcing a task
        leaves the layout of a given seed unchanged.
        """
        super().reset(seed=seed)
        rng, spec = self.np_random, self.config.scene
        block, target = int(rng.integers(len(BLOCKS))), int(rng.integers(len(TARGETS)))
        options = options or {}
        block = _index(options.get("block", block), BLOCKS, "block")
        target = _index(options.get("target", target), TARGETS, "target")
        qpos = _sample_layout(rng, spec)

        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:] = qpos
        mujoco.mj_forward(self.model, self.data)
        self._task = (block, target)
        self._instruction = make_instruction(block, target)
        self._step, self._clip_count, self._phase = 0, 0, _RUNNING
        return self._obs(), self._info(False, False)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one action for ``frame_skip`` substeps (0.1 s)."""
        if self._phase != _RUNNING:
            raise RuntimeError("PushBlockEnv.step() called before reset() or after the episode ended; call reset()")
        a = _check_action(action)
        clipped = np.clip(a, -1.0, 1.0)
        n_clipped = int(np.count_nonzero(clipped != a))
        self._clip_count += n_clipped
        self.data.ctrl[:] = clipped * self.config.max_speed
        mujoco.mj_step(self.model, self.data, nstep=self.config.frame_skip)
        self._step += 1

        reward, success = self._reward()
        truncated = not success and self._step >= self.config.max_steps
        if success or truncated:
            self._phase = _OVER
        return self._obs(), reward, success, truncated, self._info(success, n_clipped > 0)

    def render(self) -> np.ndarray | None:
        """Return a ``render_size`` top-down RGB frame (``render_mode="rgb_array"``), else None."""
        if self.render_mode is None:
            gym.logger.warn("render() called with render_mode=None; pass render_mode='rgb_array'")
            return None
        if self._frame_renderer is None:
            self._frame_renderer = self._make_renderer(self.config.render_size, "front")
        return self._frame_renderer.render(self.data.qpos)

    def close(self) -> None:
        """Free renderer resources; safe to call twice."""
        for r in [*self._image_renderers.values(), self._frame_renderer]:
            if isinstance(r, MujocoRenderer):
                r.close()

    # ------------------------------------------------------------ task facts
    @property
    def task(self) -> tuple[int, int]:
        """Current ``(block, target)`` indices into ``BLOCKS`` / ``TARGETS``."""
        return self._task

    @property
    def instruction(self) -> str:
        """Current instruction."""
        return self._instruction

    @property
    def dt(self) -> float:
        """Seconds of simulated time one step covers: ``frame_skip`` x the physics timestep (0.1 s, 10 Hz, by default)."""
        return float(self.model.opt.timestep) * self.config.frame_skip

    # ------------------------------------------------------------ exact state
    def get_state(self) -> dict[str, np.ndarray]:
        """Return fresh copies of everything the future of this env depends on.

        Entries: ``mj_state`` float64 ``(n,)`` (``mjSTATE_INTEGRATION``),
        ``model_digest`` uint8 ``(32,)`` (sha256 of the MJCF), ``rng`` uint64
        ``(7,)`` (see ``rng_to_array``), ``step`` / ``clip_count`` / ``phase``
        int64 ``(1,)``, ``task`` int64 ``(2,)`` (block, target) and
        ``instruction`` uint8 ``(64,)`` (ASCII, zero-padded).
        """
        instr = np.zeros(MAX_INSTRUCTION_LEN, dtype=np.uint8)
        raw = self._instruction.encode("ascii")
        instr[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return {
            "mj_state": get_mj_state(self.model, self.data),
            "model_digest": np.frombuffer(self._digest, dtype=np.uint8).copy(),
            "rng": rng_to_array(self.np_random),
            "step": np.array([self._step], dtype=np.int64),
            "clip_count": np.array([self._clip_count], dtype=np.int64),
            "phase": np.array([self._phase], dtype=np.int64),
            "task": np.array(self._task, dtype=np.int64),
            "instruction": instr,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (this env or one built the same way).

        Everything is validated before the first write.

        Raises:
            StateMismatch: wrong entries, dtypes, shapes, model digest or inconsistent values.
        """
        s = validate_state(state, self._state_spec, self._digest, ENV_ID)
        block, target = (int(x) for x in s["task"])
        if not (0 <= block < len(BLOCKS) and 0 <= target < len(TARGETS)):
            raise StateMismatch(f"{ENV_ID}: task {(block, target)} out of range")
        instruction = bytes(s["instruction"]).rstrip(b"\0").decode("ascii", errors="replace")
        if instruction != make_instruction(block, target):
            raise StateMismatch(f"{ENV_ID}: instruction {instruction!r} does not match task {(block, target)}")
        phase, step = int(s["phase"][0]), int(s["step"][0])
        if phase not in (_NEEDS_RESET, _RUNNING, _OVER) or not 0 <= step <= self.config.max_steps:
            raise StateMismatch(f"{ENV_ID}: phase {phase} / step {step} out of range")
        rng_state = rng_state_from_array(s["rng"], self.np_random)

        set_mj_state(self.model, self.data, s["mj_state"])
        self.np_random.bit_generator.state = rng_state
        self._task, self._instruction = (block, target), instruction
        self._step, self._clip_count, self._phase = step, int(s["clip_count"][0]), phase

    def live_state(self) -> dict[str, np.ndarray]:
        """``Stateful``: the same as :meth:`get_state`."""
        return self.get_state()

    def load_live_state(self, state: dict[str, Any]) -> None:
        """``Stateful``: the same as :meth:`set_state`."""
        self.set_state(state)

    def state_fingerprint(self) -> dict:
        """``Stateful``: what exactness of the state depends on (JSON-able)."""
        cfg = self.config
        return {
            "env_id": ENV_ID,
            "mujoco": mujoco.__version__,
            "model_digest": "sha256:" + self._digest.hex(),
            "state_spec": spec_to_json(self._state_spec),
            "dynamics": {
                "frame_skip": cfg.frame_skip,
                "max_steps": cfg.max_steps,
                "success_radius": cfg.success_radius,
            },
        }

    # --------------------------------------------------------------- private
    def _make_renderer(self, size: int, camera: str) -> NumpyRenderer | MujocoRenderer:
        if self.config.renderer == "mujoco":
            return MujocoRenderer(self.model, size, camera)
        return NumpyRenderer(self.config.scene, size)

    def _obs(self) -> dict[str, Any]:
        q, v = self.data.qpos, self.data.qvel
        blocks = q[2:].reshape(len(BLOCKS), 3)
        state = np.empty(STATE_DIM, dtype=np.float32)
        state[0:2] = q[0:2]
        state[2:4] = np.clip(v[0:2], -1.0, 1.0)
        nb = len(BLOCKS)
        per = state[4 : 4 + 4 * nb].reshape(nb, 4)
        per[:, 0:2] = blocks[:, 0:2] - q[0:2]  # egocentric: relative to the pusher
        per[:, 2] = np.sin(blocks[:, 2])
        per[:, 3] = np.cos(blocks[:, 2])
        tgt = state[4 + 4 * nb :].reshape(len(TARGETS), 4)
        tgt[:, 0:2] = self._targets - q[0:2]
        tgt[:, 2:4] = self._targets
        obs: dict[str, Any] = {"state": state}
        if self.config.block_velocity:
            bv = np.array(v[2:], dtype=np.float64).reshape(len(BLOCKS), 3)
            bv[:, 2] *= 0.1
            obs["block_velocity"] = np.clip(bv, -1.0, 1.0).astype(np.float32).reshape(-1)
        if self.config.render_images:
            for cam, r in self._image_renderers.items():
                obs[f"image_{cam}"] = r.render(q)
        obs["instruction"] = self._instruction
        return obs

    def _distances(self) -> tuple[float, float]:
        q = self.data.qpos
        b, t = self._task
        bx, by = q[2 + 3 * b], q[3 + 3 * b]
        tx, ty = self._targets[t]
        return math.hypot(bx - tx, by - ty), math.hypot(bx - q[0], by - q[1])

    def _reward(self) -> tuple[float, bool]:
        d_bt, d_pb = self._distances()
        success = d_bt <= self.config.success_radius
        contact = self.config.scene.block_radius + self.config.scene.pusher_radius
        reward = -d_bt - 0.25 * max(d_pb - contact, 0.0) + (1.0 if success else 0.0)
        return float(reward), bool(success)

    def _info(self, success: bool, clipped: bool) -> dict[str, Any]:
        d_bt, _ = self._distances()
        return {
            "is_success": success,
            "action_clipped": clipped,
            "clip_count": self._clip_count,
            "block_to_target": d_bt,
        }


def _index(value: int | str, names: tuple[str, ...], what: str) -> int:
    if isinstance(value, str):
        if value not in names:
            raise ValueError(f"unknown {what} {value!r}; expected one of {names}")
        return names.index(value)
    if not 0 <= int(value) < len(names):
        raise ValueError(f"{what} index {value} out of range 0..{len(names) - 1}")
    return int(value)


def _check_action(action: Any) -> np.ndarray:
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise BadAction(f"action must be 2 numbers, got {action!r}") from err
    if a.shape != (2,):
        raise BadAction(f"action must have shape (2,), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise BadAction(
            f"action has non-finite values {a.tolist()}; the simulator was not stepped "
            "(check the policy output for NaN/Inf)"
        )
    return a


def _sample_layout(rng: np.random.Generator, spec: SceneSpec) -> np.ndarray:
    """Draw a start qpos: pusher near the robot edge, blocks in the lower half, apart.

    The pusher starts below (robot side of) the blocks and the targets are
    above them, so it usually starts behind its block and pushes away from itself.
    """
    qpos = np.zeros(2 + 3 * len(BLOCKS), dtype=np.float64)
    qpos[0] = rng.uniform(-0.15, 0.15)
    qpos[1] = rng.uniform(-0.21, -0.17)
    placed: list[tuple[float, float]] = []
    for i in range(len(BLOCKS)):
        for _ in range(100):
            x, y = rng.uniform(-0.17, 0.17), rng.uniform(-0.10, 0.02)
            if all(math.hypot(x - px, y - py) >= 2 * spec.block_radius + 0.02 for px, py in placed):
                break
        else:  # pragma: no cover - 100 misses are practically impossible for 3 blocks
            x, y = -0.12 + 0.12 * i, -0.04
        placed.append((x, y))
        qpos[2 + 3 * i : 5 + 3 * i] = (x, y, rng.uniform(-0.3, 0.3))
    return qpos
