"""A scripted PushBlock expert with noise knobs, for demonstrations that include failures."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollcap.envs.scene import BLOCKS, SceneSpec, parse_instruction


@dataclass(frozen=True)
class ExpertNoise:
    """How imperfect the expert is; all zero gives the clean expert."""

    action_std: float = 0.0
    """Std of Gaussian noise added to every action (before clipping to [-1, 1])."""
    wrong_block_prob: float = 0.0
    """Per-episode probability of pushing a different block than instructed."""
    give_up_prob: float = 0.0
    """Per-episode probability of stopping (zero actions) at a random step."""
    give_up_after: tuple[int, int] = (5, 25)
    """Range of the step at which a give-up episode stops."""

    def __post_init__(self) -> None:
        if self.action_std < 0:
            raise ValueError(f"action_std must be >= 0, got {self.action_std}")
        for name in ("wrong_block_prob", "give_up_prob"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        lo, hi = self.give_up_after
        if not 0 <= lo < hi:
            raise ValueError(f"give_up_after must be (lo, hi) with 0 <= lo < hi, got {self.give_up_after}")


class ScriptedExpert:
    """Smooth reactive pushing controller reading the state vector and the instruction.

    A velocity field in polar coordinates ``(rho, theta)`` around the named
    block, with ``theta = 0`` straight behind it on the push line (the goal ->
    block line extended). The pusher circles the block towards ``theta = 0``
    (tangential speed proportional to ``theta``) while holding a radius that
    blends continuously with alignment ``s = min(|theta| / ALIGN_ANGLE, 1)``:
    ``CLEARANCE`` outside contact when misaligned (it goes around without
    touching), and ``depth`` *inside* contact when aligned, so it pushes the
    (round) block through its centre, steering it by sliding around it.
    ``depth`` shrinks near the target (``PUSH_GAIN * distance``), so it slows
    to a stop there. The only discontinuity is the choice of side straight in
    front of the block (``theta = +-pi``); there are no modes, waypoints or
    back-offs, so behaviour cloning can fit it. Call :meth:`reset` at the
    start of every episode (it draws the episode's mistakes from ``seed``),
    then :meth:`act` once per step. Single-threaded.
    """

    ALIGN_ANGLE = 1.2
    """|theta| (rad) beyond which the pusher keeps clear of the block instead of pushing."""
    CLEARANCE = 0.015
    """Gap (m) kept from the block while going around it."""
    PUSH_DEPTH = 0.05
    """How far inside contact (m) the pusher aims when aligned (sets the pushing speed)."""
    PUSH_GAIN = 0.5
    """Push depth per metre of block-target distance, so pushing slows near the target."""
    STEP_GAIN = 2.5
    """Action = displacement / (STEP_GAIN x one full-speed step of 2 cm), capped at norm 1;
    larger is a gentler, smoother field (easier to regress)."""
    TURN_GAIN = 1.0
    """Tangential step per radian of misalignment (times the radius, capped at 2 x contact)."""

    def __init__(
        self,
        noise: ExpertNoise | None = None,
        scene: SceneSpec | None = None,
        max_speed: float = 0.2,
        control_dt: float = 0.1,
    ) -> None:
        self.noise = noise or ExpertNoise()
        self.scene = scene or SceneSpec()
        self._max_step = max_speed * control_dt  # metres per step at |action| = 1
        self._rng = np.random.default_rng(0)
        self._block_override: int | None = None
        self._give_up_at: int | None = None
        self._t = 0

    @classmethod
    def for_env(cls, config, noise: ExpertNoise | None = None) -> ScriptedExpert:
        """The expert for an env built with ``config`` (a :class:`~rollcap.envs.push_block.PushBlockConfig`): its scene,
        its speed and its control period (``frame_skip`` physics steps), which scale every action."""
        return cls(
            noise, scene=config.scene, max_speed=config.max_speed, control_dt=config.frame_skip * config.scene.timestep
        )

    def reset(self, seed: int | None = None) -> None:
        """Start an episode: reseed and draw this episode's mistakes (if any)."""
        self._rng = np.random.default_rng(seed)
        n = self.noise
        self._t = 0
        wrong = self._rng.random() < n.wrong_block_prob
        self._block_override = int(self._rng.integers(1, len(BLOCKS))) if wrong else None
        give_up = self._rng.random() < n.give_up_prob
        self._give_up_at = int(self._rng.integers(*n.give_up_after)) if give_up else None

    @property
    def mistake(self) -> str | None:
        """``"wrong_block"``, ``"give_up"`` or None for this episode."""
        if self._block_override is not None:
            return "wrong_block"
        return "give_up" if self._give_up_at is not None else None

    def act(self, obs: Mapping[str, Any]) -> np.ndarray:
        """Return a float32 action in [-1, 1]^2 for an observation with ``state`` and ``instruction``."""
        block, target = parse_instruction(str(obs["instruction"]))
        if self._block_override is not None:
            block = (block + self._block_override) % len(BLOCKS)
        t = self._t
        self._t += 1
        if self._give_up_at is not None and t >= self._give_up_at:
            action = np.zeros(2)
        else:
            action = self._clean_action(np.asarray(obs["state"], dtype=np.float64), block, target)
        if self.noise.action_std > 0:
            action = action + self._rng.normal(0.0, self.noise.action_std, size=2)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _clean_action(self, state: np.ndarray, block: int, target: int) -> np.ndarray:
        """A smooth velocity field in polar coordinates around the block (see the class docstring)."""
        p = state[0:2]
        b = p + state[4 + 4 * block : 6 + 4 * block]  # block offsets are relative to the pusher
        goal = np.asarray(self.scene.target_xy[target], dtype=np.float64)
        d = goal - b
        dist = math.hypot(*d)
        u = d / max(dist, 1e-9)  # push direction
        n = np.array([-u[1], u[0]])
        rel = p - b
        rho = max(math.hypot(*rel), 1e-9)
        theta = math.atan2(float(rel @ n), -float(rel @ u))  # 0 = straight behind the block
        e_r = rel / rho
        e_t = math.sin(theta) * u + math.cos(theta) * n  # direction of increasing theta
        contact = self.scene.block_radius + self.scene.pusher_radius
        s = min(abs(theta) / self.ALIGN_ANGLE, 1.0)  # 0 aligned .. 1 misaligned
        depth = min(self.PUSH_DEPTH, self.PUSH_GAIN * dist)
        rho_goal = contact + s * self.CLEARANCE - (1.0 - s) * depth
        delta = (rho_goal - rho) * e_r - self.TURN_GAIN * theta * min(rho, 2 * contact) * e_t
        return self._to_action(delta)

    def _to_action(self, delta: np.ndarray) -> np.ndarray:
        a = delta / (self.STEP_GAIN * self._max_step)
        norm = math.hypot(*a)
        return a / norm if norm > 1.0 else a
