"""MetaWorld's 50 v3 tasks as rollcap envs: ``rollcap/MetaWorld-<task>``, exact, with images and an instruction.

``gym.make("rollcap/MetaWorld-push-v3")`` builds the task's Sawyer env from
``metaworld`` (``pip install scipy imageio && pip install --no-deps metaworld==3.1.1``: its
metadata pins ``mujoco==3.3.0``, and rollcap runs it on the MuJoCo it has) and returns it as
``ExactStateWrapper(MetaWorldObservation(sim))``: the one exact-state path of
:mod:`rollcap.envs.adapters`, over an observation dict rollcap's policies read
(``state``, ``image_<camera>``, ``instruction``).

What is changed against a plain ``metaworld`` env, and why (each is a subclass
override of the task's class, :func:`sim_class`; the library is not patched):

- **Seeding.** MetaWorld ignores ``reset(seed=)`` and, under ``MT1``, picks
  one of 50 task variations drawn from the *global* numpy RNG when the
  benchmark is built. Here ``reset(seed=s)`` calls MetaWorld's own
  ``seed(s)`` and the variation (object and goal positions, ``rand_vec``) is
  drawn from the env's seeded ``np_random`` at every reset (MetaWorld's
  ``seeded_rand_vec`` mode, from the same uniform box ``MT1`` samples), so an
  episode is a pure function of its seed; an unseeded reset draws the next
  variation from the same generator (which is in the exact state).
- **Goal observed.** Like MetaWorld's multi-task benchmarks (``MT1``/``MT10``),
  the goal position is in the observation (``partially_observable=False``).
- **An honest observation space.** MetaWorld's declared ``Box`` does not hold
  its reset observations, so gymnasium's ``check_env`` fails on it; the space
  here is ``Box(-inf, inf, (39,), float64)``, which holds everything it returns.
- **MuJoCo >= 4.** ``mjNEQDATA`` grew from 11 to 12 in MuJoCo 4.0 and
  MetaWorld 3.1.1 writes 11 numbers into each weld row of ``eq_data`` when it is
  built (``ValueError: could not broadcast input array from shape (11,) into
  shape (12,)``). The override writes the same 11 numbers and sets the new
  ``eq_data[11]`` (compute the relative pose from ``qpos0``) to 0, as MuJoCo's
  changelog prescribes for a weld whose pose is set directly; on MuJoCo 3 the
  row has 11 entries and nothing else changes.
- **Copies.** MetaWorld's ``__getstate__`` keeps only qpos/qvel and rebuilds the
  model from XML, losing the weld fix, the moved bodies and the mocap pose, so a
  deep copy (what the exact-state check probes on) copies every attribute instead.

Exact state: MuJoCo's integration state and body frames (the wrapper's), the
env's ``np_random``, and as task state (:mod:`rollcap.envs.task_state`) every
numeric attribute the Sawyer env holds after a reset (path length, previous
observation for frame stacking, goal and object positions, reward
normalisers) plus ``model_body_pos`` / ``model_site_pos``: MetaWorld moves
bodies and sites of its *model* at reset (a drawer, the goal site), so those two
model arrays are task state and the model digest masks them
(:meth:`_Sawyer.rollcap_model_digest`).

Images: MuJoCo's renderer (``MUJOCO_GL=egl`` or ``osmesa`` set before
``mujoco`` is imported; unset, :mod:`rollcap.envs.gl` picks one, and a backend
that cannot render here is refused at construction, naming ``MUJOCO_GL``) on a
private ``MjData`` from qpos and the mocap pose, shadows off by default (with a
software GL the shadow pass is most of a frame).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
from dataclasses import dataclass
from functools import cache
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from rollcap.envs.gl import check_renderer
from rollcap.envs.render import MujocoRenderer
from rollcap.envs.task_state import kind_of
from rollcap.envs.errors import NoExactState, RenderUnavailable

ID_PREFIX = "rollcap/MetaWorld-"
"""``rollcap/MetaWorld-<task>``, e.g. ``rollcap/MetaWorld-push-v3`` (the task's own name and version)."""

INSTRUCTIONS: dict[str, str] = {
    "assembly-v3": "put the ring on the peg",
    "basketball-v3": "dunk the ball into the basket",
    "bin-picking-v3": "move the puck from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button behind the wall from the top",
    "button-press-v3": "press the button",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "pick the ring off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by turning the lock",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by turning the lock",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the puck out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate into the cabinet from the side",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate out of the cabinet to the side",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg from the side",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grasp the stick and push the box with it",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-v3": "reach the goal",
    "reach-wall-v3": "reach the goal behind the wall",
    "shelf-place-v3": "place the puck on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
"""Task -> instruction (the observation's ``instruction``), for every MetaWorld v3 task.

Kept here, not read from ``metaworld``, so the ids register without importing it."""

TASKS: tuple[str, ...] = tuple(INSTRUCTIONS)
"""The 50 MetaWorld v3 tasks."""

MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3",
    "drawer-close-v3", "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)  # fmt: skip
"""MetaWorld's MT10 benchmark tasks."""

CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
"""Cameras of the Sawyer scene."""

STATE_DIM = 39
"""MetaWorld's observation: hand xyz, gripper opening, 14 object numbers (two objects' xyz + quat), the
same 18 of the previous step, the goal xyz."""

_MODEL_FIELDS = ("body_pos", "site_pos")
"""mjModel arrays MetaWorld rewrites at reset (measured over MT10: only these two change)."""

_DATA_VIEWS = ("qpos", "qvel", "mocap_pos", "mocap_quat", "xpos", "xquat", "xipos", "xmat", "geom_xpos", "site_xpos")
"""mjData arrays an attribute may be a view into (then it is no task state of its own)."""

_OPTIONAL_FLOATS = ("_target_to_obj_init",)
"""Sawyer attributes that are None after a reset and a number from the first step on (bin-picking's reward
normaliser), captured through :attr:`_Sawyer.optional_floats`."""

_NOT_STATE = frozenset({"_last_stable_obs"})
"""Sawyer attributes written before they are read on every step (``None`` after a reset): not state."""

MAX_IMAGE_SIZE = 512
"""Largest camera side (a software-GL frame of that size costs seconds; larger is a mistake)."""


def _require_metaworld():
    try:
        import metaworld  # noqa: F401
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    except ImportError as err:
        raise gym.error.DependencyNotInstalled(
            f"rollcap/MetaWorld-* envs need metaworld ({err}): pip install scipy imageio (rollcap's [metaworld] extra) && pip install --no-deps "
            "metaworld==3.1.1 (its metadata pins mujoco==3.3.0; rollcap runs it on the MuJoCo installed)"
        ) from err
    return ALL_V3_ENVIRONMENTS


class _Sawyer:
    """Mixin over a MetaWorld v3 task class; see the module docstring for each override.

    Single-threaded. Constructed reset (seed 0), so its task state has its after-reset shapes.
    """

    def __init__(self, max_steps: int = 500) -> None:
        super().__init__()
        self.max_path_length = max_steps
        self._partially_observable = False
        self.__dict__.pop("sawyer_observation_space", None)  # a cached_property computed for the hidden goal
        self._freeze_rand_vec, self.seeded_rand_vec, self._set_task_called = False, True, True
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(STATE_DIM,), dtype=np.float64)
        self._model_digest = _masked_digest(self.model)
        self.reset(seed=0)
        # beside its family's (TASK_ATTRIBUTES): every other number it holds after a reset, and the moved model arrays
        own = sorted(
            k for k, v in vars(self).items() if k not in _NOT_STATE and _capturable(v) and not self._aliases_data(v)
        )
        optional = ("optional_floats",) if any(k in vars(self) for k in _OPTIONAL_FLOATS) else ()
        self.rollcap_task_attributes = (*own, "model_body_pos", "model_site_pos", *optional)

    def _aliases_data(self, value: Any) -> bool:
        """Whether ``value`` is a view into ``mjData`` (``get_body_com`` returns one: pick-place's
        ``init_left_pad`` follows the pad as it moves). Not task state: it reads the restored physics."""
        if not isinstance(value, np.ndarray):
            return False
        return any(np.shares_memory(value, getattr(self.data, f)) for f in _DATA_VIEWS)

    def reset_mocap_welds(self) -> None:
        """MetaWorld's weld parameters, written so that MuJoCo 3 (11 numbers a row) and 4 (12) read them alike."""
        weld = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0]
        for i in range(self.model.neq):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, :11] = weld
                self.model.eq_data[i, 11:] = 0.0  # MuJoCo >= 4: the relative pose is given, not computed from qpos0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """MetaWorld's reset; ``seed`` seeds the env (and so this and the following variations)."""
        if seed is not None:
            self.seed(seed)
        return super().reset()

    @property
    def rollcap_step_limit(self) -> int:
        """Steps after which the env truncates itself (``max_path_length``; in the env fingerprint as ``step_limit``)."""
        return int(self.max_path_length)

    @property
    def model_body_pos(self) -> np.ndarray:
        """``model.body_pos`` (task state: MetaWorld places objects by moving bodies of the model)."""
        return self.model.body_pos

    @model_body_pos.setter
    def model_body_pos(self, value: np.ndarray) -> None:
        self.model.body_pos[...] = value

    @property
    def model_site_pos(self) -> np.ndarray:
        """``model.site_pos`` (task state: MetaWorld moves the goal site of the model)."""
        return self.model.site_pos

    @model_site_pos.setter
    def model_site_pos(self, value: np.ndarray) -> None:
        self.model.site_pos[...] = value

    @property
    def optional_floats(self) -> np.ndarray:
        """The :data:`_OPTIONAL_FLOATS` as float64, NaN for None (task state that is None until the first step)."""
        values = [getattr(self, k, None) for k in _OPTIONAL_FLOATS]
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    @optional_floats.setter
    def optional_floats(self, value: np.ndarray) -> None:
        for key, v in zip(_OPTIONAL_FLOATS, np.asarray(value).tolist()):
            if key in vars(self):
                setattr(self, key, None if np.isnan(v) else v)

    def rollcap_model_digest(self) -> bytes:
        """sha256 of the compiled model as built, with the task-state arrays ``body_pos`` and ``site_pos`` zeroed.

        Taken once at construction (an 18 MB MJB takes ~80 ms to hash): MetaWorld
        writes no other model array after it is built.
        """
        return self._model_digest

    def __deepcopy__(self, memo: dict) -> Any:
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        for key, value in vars(self).items():
            setattr(twin, key, None if key == "mujoco_renderer" else copy.deepcopy(value, memo))
        return twin


def _capturable(value: Any) -> bool:
    try:
        kind_of(value, "")
    except NoExactState:
        return False
    return True


def _masked_digest(model: mujoco.MjModel) -> bytes:
    masked = copy.copy(model)
    for field in _MODEL_FIELDS:
        getattr(masked, field)[...] = 0.0
    buf = np.zeros(mujoco.mj_sizeModel(masked), dtype=np.uint8)
    mujoco.mj_saveModel(masked, None, buf)
    return hashlib.sha256(buf.tobytes()).digest()


@cache
def sim_class(task: str) -> type:
    """The class of ``task``'s Sawyer env under rollcap (a subclass of MetaWorld's; cached).

    Raises:
        gym.error.DependencyNotInstalled: metaworld is not installed.
        ValueError: no such task (with the nearest name).
    """
    classes = _require_metaworld()
    if task not in classes:
        near = difflib.get_close_matches(task, list(classes), n=1)
        raise ValueError(f"no MetaWorld v3 task {task!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    base = classes[task]
    return type(
        f"Rollcap{base.__name__}", (_Sawyer, base), {"__module__": __name__, "__qualname__": f"Rollcap{base.__name__}"}
    )


@dataclass(frozen=True)
class MetaWorldConfig:
    """Options of a ``rollcap/MetaWorld-<task>`` env (``gym.make`` keyword arguments)."""

    image_size: int = 64
    """Side of each observation image in pixels."""
    render_images: bool = True
    """Put ``image_<camera>`` keys in the observation; False skips rendering (no GL needed)."""
    cameras: tuple[str, ...] = ("corner",)
    """Cameras to render, from :data:`CAMERAS`."""
    shadows: bool = False
    """Draw shadows (about 10x a frame's cost with a software GL)."""
    max_steps: int = 500
    """Steps before MetaWorld truncates the episode (its ``max_path_length``)."""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.image_size, int)
            or isinstance(self.image_size, bool)
            or not 8 <= self.image_size <= MAX_IMAGE_SIZE
        ):
            raise ValueError(f"image_size must be an int in 8..{MAX_IMAGE_SIZE}, got {self.image_size!r}")
        object.__setattr__(self, "cameras", tuple(self.cameras))
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad or not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"cameras must be distinct names from {CAMERAS}, got {self.cameras!r}")
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool) or self.max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {self.max_steps!r}")
        for name in ("render_images", "shadows"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> MetaWorldConfig:
        """The config of these keyword arguments; an unknown name gets a suggestion."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in names:
                near = difflib.get_close_matches(key, names, n=1)
                raise TypeError(
                    f"MetaWorld env got an unknown option {key!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                )
        return cls(**kwargs)


class MetaWorldObservation(gym.ObservationWrapper):
    """MetaWorld's flat observation as rollcap's dict: ``state``, ``image_<camera>``, ``instruction``; ``info["is_success"]``.

    ``state`` float32 ``(39,)`` (:data:`STATE_DIM`, unbounded), one uint8
    ``(S, S, 3)`` image per camera, rendered from the Sawyer env's qpos and mocap
    pose on a private ``MjData`` (so it holds no state and reads none of the
    simulation's derived arrays), and the task's instruction (:data:`INSTRUCTIONS`).
    """

    def __init__(self, env: gym.Env, task: str, config: MetaWorldConfig, render_mode: str | None = None) -> None:
        super().__init__(env)
        if task not in INSTRUCTIONS:
            raise ValueError(f"no instruction for MetaWorld task {task!r}")
        self.task, self.config, self.instruction = task, config, INSTRUCTIONS[task]
        # MetaWorld's own metadata lists modes (human, depth) this env does not take: render() shows what the policy
        # sees, the first camera's image, so "rgb_array" only, and only where there are images.
        self.metadata = {
            "render_modes": ["rgb_array"] if config.render_images else [],
            "render_fps": round(1.0 / float(env.unwrapped.dt)),
        }
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(
                f"render_mode must be None or 'rgb_array' (the first camera's image; needs render_images=True), got {render_mode!r}"
            )
        self._render_mode = render_mode
        self._last: dict[str, Any] | None = None  # the last observation (render() shows its first camera)
        obs = {"state": spaces.Box(-np.inf, np.inf, shape=(STATE_DIM,), dtype=np.float32)}
        if config.render_images:
            s = config.image_size
            obs |= {f"image_{c}": spaces.Box(0, 255, shape=(s, s, 3), dtype=np.uint8) for c in config.cameras}
        longest = max(len(t) for t in INSTRUCTIONS.values())
        obs["instruction"] = spaces.Text(max_length=longest, min_length=1, charset="abcdefghijklmnopqrstuvwxyz ")
        self.observation_space = spaces.Dict(obs)
        self._renderers: dict[str, MujocoRenderer] = {}

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        """MetaWorld's step, with ``info["is_success"]``: its ``info["success"]`` as the bool rollcap stops on.

        The host ends an episode at its first success, as MetaWorld's own
        evaluation does (``terminate_on_success``); MetaWorld itself never terminates.
        """
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.observation(obs), reward, terminated, truncated, {**info, "is_success": bool(info["success"])}

    def observation(self, observation: np.ndarray) -> dict[str, Any]:
        """The dict of one flat MetaWorld observation (rendering the cameras now)."""
        out: dict[str, Any] = {"state": np.asarray(observation, dtype=np.float32)}
        if self.config.render_images:
            sim = self.env.unwrapped
            for cam in self.config.cameras:
                if cam not in self._renderers:
                    self._renderers[cam] = MujocoRenderer(sim.model, self.config.image_size, cam, self.config.shadows)
                out[f"image_{cam}"] = self._renderers[cam].render(
                    sim.data.qpos, sim.data.mocap_pos, sim.data.mocap_quat
                )
        out["instruction"] = self.instruction
        self._last = out
        return out

    @property
    def render_mode(self) -> str | None:
        return self._render_mode

    def render(self) -> np.ndarray | None:
        """``render_mode="rgb_array"``: the first camera's image of the last observation (what the policy sees)."""
        if self._render_mode is None or self._last is None:
            return None
        return np.array(self._last[f"image_{self.config.cameras[0]}"])

    def close(self) -> None:
        """Free the GL contexts, then close the env; safe to call twice."""
        for r in self._renderers.values():
            r.close()
        self._renderers.clear()
        super().close()

    def __deepcopy__(self, memo: dict) -> Any:
        twin = copy.copy(self)
        memo[id(self)] = twin
        twin.env = copy.deepcopy(self.env, memo)
        twin._renderers = {}  # a copy renders with its own GL context, on first use
        return twin


def make_metaworld_env(task: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Entry point of ``rollcap/MetaWorld-<task>``: the exact, observation-dict env of a MetaWorld v3 task.

    Args:
        task: a MetaWorld v3 task name (``push-v3``; :data:`TASKS`).
        render_mode: None, or ``"rgb_array"`` with images: ``render()`` returns the first camera's image.
        **kwargs: :class:`MetaWorldConfig` fields.

    Raises:
        gym.error.DependencyNotInstalled: metaworld is not installed.
        TypeError / ValueError: a bad option.
    """
    from rollcap.envs.adapters import ExactStateWrapper

    config = MetaWorldConfig.from_kwargs(**kwargs)
    if render_mode not in (None, "rgb_array") or (render_mode is not None and not config.render_images):
        raise ValueError(
            f"render_mode must be None or 'rgb_array' (the first camera's image; needs render_images=True), got {render_mode!r}"
        )
    if config.render_images:
        try:
            check_renderer()  # before anything renders: a GL backend that cannot work is one line naming MUJOCO_GL
        except RenderUnavailable as err:
            raise gym.error.DependencyNotInstalled(f"its images need a GL backend: {err}") from None
    sim = sim_class(task)(max_steps=config.max_steps)
    return ExactStateWrapper(
        MetaWorldObservation(sim, task, config, render_mode), extra_stateless=(MetaWorldObservation,)
    )


def register_metaworld() -> None:
    """Register ``rollcap/MetaWorld-<task>`` for the 50 tasks (without importing metaworld); idempotent."""
    for task in TASKS:
        env_id = ID_PREFIX + task
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="rollcap.envs.metaworld:make_metaworld_env",
                kwargs={"task": task},
                order_enforce=False,
                disable_env_checker=True,
            )
