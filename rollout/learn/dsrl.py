"""DSRL: Stable-Baselines3 SAC steering a frozen policy's flow noise (the built-in task, or any env and checkpoints).

The pieces ``examples/dsrl_sac.py`` wires together:

- :class:`SteeringConfig`: what the agent sees, how far it may push the noise,
  its reward, how many actions of each chunk run.
- :func:`make_steering_env`: :class:`~rollcap.rollout.gym.envs.NoiseSteeringEnv`
  (the shipped policy and critic, or the env and checkpoints a
  :class:`~rollcap.rollout.spec.Parts` names, e.g. a MetaWorld task with the
  MT10 policy and critic) inside three one-hook wrappers:
  :class:`SteeringObs` (a flat vector for an MLP), :class:`NoiseBound` (the
  agent's noise box) and :class:`SuccessBonus` (with the env's reward scaled).
- :func:`train_sac`: SAC with a wall-clock budget.
- :mod:`~rollcap.rollout.learn.sac_io`: the trained agent saved and loaded
  without pickle.
- :func:`compare`: the trained agent (its deterministic action) against the
  frozen policy on the same held-out episode seeds, paired.

The frozen side is exactly ``rollcap run --execute-steps 8 --seed S``: the
env's own host runs ``run_episode`` with the episode's derived noise
(``host.boundary()`` without noise), so no clipping or wrapper touches it.

Imports point down: gym_env, host, seeding; nothing in rollcap imports this
module. Needs the ``rl`` extra (stable-baselines3).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rollcap.envs.scene import BLOCKS, TARGETS, parse_instruction
from rollcap.rollout.errors import ConfigError
from rollcap.policies.observation import BOS, EOS
from rollcap.rollout.spec import DEFAULT_ENV
from rollcap.rollout.gym.envs import NOISE_BOUND, NoiseSteeringEnv, make_noise_steering_env
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.learn.logs import sb3_logger
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.stats import mcnemar_p, paired_difference, wilson

try:
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
except ImportError as err:  # pragma: no cover - the rl extra is installed in CI
    raise ImportError("rollcap.rollout.learn.dsrl needs stable-baselines3: pip install 'rollcap[rl]'") from err


@dataclass(frozen=True)
class SteeringConfig:
    """The agent's view of the task: observation, noise box, reward, chunk execution."""

    noise_bound: float = 1.5
    """The agent's noise lies in [-bound, bound] per element (DSRL's action magnitude; standard-normal noise exceeds 1.5 13% of the time)."""
    success_bonus: float = 5.0
    """Added to the reward of the chunk that ends in success (the built-in env itself adds 1.0 on the success step)."""
    env_reward_scale: float = 1.0
    """The env's own reward is multiplied by this (0: a sparse reward, the success bonus alone; MetaWorld's shaped
    reward is up to 10 a step)."""
    chunk_penalty: float = 0.0
    """Subtracted from every chunk's reward (1 with no bonus and scale 0: -1 a chunk until success, DSRL's robomimic
    reward, under which finishing sooner is always worth more)."""
    value_in_obs: bool = True
    """Give the agent the critic's value of the current observation."""
    execute_steps: int = 8
    """Actions of each 8-action chunk the env executes (8: whole chunks, where the frozen policy succeeds about 70%)."""

    def __post_init__(self):
        if not (isinstance(self.noise_bound, (int, float)) and 0 < self.noise_bound <= NOISE_BOUND):
            raise ConfigError("noise_bound", f"expected a number in (0, {NOISE_BOUND}], got {self.noise_bound!r}")
        if not (
            isinstance(self.success_bonus, (int, float))
            and math.isfinite(self.success_bonus)
            and self.success_bonus >= 0
        ):
            raise ConfigError("success_bonus", f"expected a finite number >= 0, got {self.success_bonus!r}")
        for name in ("env_reward_scale", "chunk_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(name, f"expected a finite number >= 0, got {v!r}")
        if not isinstance(self.execute_steps, int) or isinstance(self.execute_steps, bool) or self.execute_steps < 1:
            raise ConfigError("execute_steps", f"expected an integer >= 1, got {self.execute_steps!r}")


# ------------------------------------------------------------------ wrappers
def instruction_text(tokens: np.ndarray) -> str:
    """The instruction of ``instruction_tokens`` (byte tokens between BOS and EOS)."""
    tokens = np.asarray(tokens)
    end = int(np.flatnonzero(tokens == EOS)[0]) if (tokens == EOS).any() else len(tokens)
    return bytes(int(t) for t in tokens[1 if tokens[0] == BOS else 0 : end]).decode("utf-8")


def task_one_hot(tokens: np.ndarray) -> np.ndarray:
    """The built-in task's instruction as its block and target, a float32 one-hot of length ``len(BLOCKS) + len(TARGETS)``."""
    block, target = parse_instruction(instruction_text(tokens))
    out = np.zeros(len(BLOCKS) + len(TARGETS), np.float32)
    out[block], out[len(BLOCKS) + target] = 1.0, 1.0
    return out


def mt10_one_hot(tokens: np.ndarray) -> np.ndarray:
    """A MetaWorld MT10 task's instruction as a float32 one-hot over the MT10 tasks."""
    from rollcap.envs.metaworld import INSTRUCTIONS, MT10

    text = instruction_text(tokens)
    names = [INSTRUCTIONS[t] for t in MT10]
    if text not in names:
        raise ValueError(f"instruction {text!r} is not an MT10 task's ({', '.join(MT10)})")
    out = np.zeros(len(MT10), np.float32)
    out[names.index(text)] = 1.0
    return out


@dataclass(frozen=True)
class TaskCode:
    """How the agent sees the task: ``encode(instruction_tokens)``, float32 ``[width]``."""

    width: int
    encode: Callable[[np.ndarray], np.ndarray]


def task_code_for(env_id: str) -> TaskCode | None:
    """The task encoding the agent sees for ``env_id``: the built-in task's block/target, an MT10 task's one-hot, else none."""
    from rollcap.envs.metaworld import ID_PREFIX, MT10
    from rollcap.rollout.spec import DEFAULT_ENV

    if env_id == DEFAULT_ENV:
        return TaskCode(len(BLOCKS) + len(TARGETS), task_one_hot)
    if env_id.startswith(ID_PREFIX) and env_id.removeprefix(ID_PREFIX) in MT10:
        return TaskCode(len(MT10), mt10_one_hot)
    return None


class SteeringObs(gym.ObservationWrapper):
    """NoiseSteeringEnv's Dict -> one float32 vector: ``state``, the task code (if any), ``value`` (1, if present).

    Images are dropped: the state holds every object and goal (the built-in
    task's egocentric 28 numbers, MetaWorld's 39), and an MLP on a few dozen
    numbers trains far faster on a CPU than a CNN. ``task_code`` turns the
    instruction tokens into numbers (default: the built-in task's, :func:`task_code_for`; None: no task code).
    """

    def __init__(self, env: gym.Env, task_code: TaskCode | None | str = "default"):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, spaces.Dict) or not {"state", "instruction_tokens"} <= set(space.spaces):
            raise ValueError(f"SteeringObs needs a Dict observation with 'state' and 'instruction_tokens', got {space}")
        self.keys = ("state", "value") if "value" in space.spaces else ("state",)
        self.task_code = task_code_for(DEFAULT_ENV) if task_code == "default" else task_code
        width = 0 if self.task_code is None else self.task_code.width
        low = np.concatenate(
            [space["state"].low, np.zeros(width, np.float32)] + ([space["value"].low] if "value" in self.keys else [])
        )
        high = np.concatenate(
            [space["state"].high, np.ones(width, np.float32)] + ([space["value"].high] if "value" in self.keys else [])
        )
        self.observation_space = spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)

    def observation(self, obs):
        code = [] if self.task_code is None else [self.task_code.encode(obs["instruction_tokens"])]
        parts = [obs["state"], *code] + ([obs["value"]] if "value" in self.keys else [])
        return np.concatenate(parts).astype(np.float32)


class NoiseBound(gym.ActionWrapper):
    """The agent's noise box narrowed to [-bound, bound] (SAC squashes into it); actions are clipped to it."""

    def __init__(self, env: gym.Env, bound: float):
        super().__init__(env)
        base = env.action_space
        if not isinstance(base, spaces.Box):
            raise ValueError(f"NoiseBound needs a Box action space, got {base}")
        if not 0 < bound <= float(np.min(base.high)):
            raise ValueError(f"bound must lie in (0, {float(np.min(base.high))}], got {bound!r}")
        self.bound = float(bound)
        self.action_space = spaces.Box(-self.bound, self.bound, base.shape, np.float32)

    def action(self, action):
        return np.clip(np.asarray(action, np.float32).reshape(self.action_space.shape), -self.bound, self.bound)


class SuccessBonus(gym.Wrapper):
    """``scale`` x the env's reward, plus ``bonus`` on the step whose ``info["is_success"]`` is true, minus ``penalty`` every step."""

    def __init__(self, env: gym.Env, bonus: float, scale: float = 1.0, penalty: float = 0.0):
        super().__init__(env)
        for name, v in (("bonus", bonus), ("scale", scale), ("penalty", penalty)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        self.bonus, self.scale, self.penalty = float(bonus), float(scale), float(penalty)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (
            obs,
            self.scale * reward + (self.bonus if info.get("is_success", False) else 0.0) - self.penalty,
            terminated,
            truncated,
            info,
        )


def make_steering_env(cfg: SteeringConfig | None = None, device: str = "cpu", parts=None) -> gym.Env:
    """A frozen policy steered through its noise; ``env.unwrapped`` is the NoiseSteeringEnv.

    ``parts``: a :class:`~rollcap.rollout.spec.Parts` naming the env, policy and critic (default: the built-in task
    with the shipped policy and critic); the agent's task code follows the env (:func:`task_code_for`).
    """
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig

    cfg = cfg or SteeringConfig()
    if parts is None:
        core = make_noise_steering_env(
            device=device, config={"execute_steps": cfg.execute_steps}, value_in_obs=cfg.value_in_obs
        )
        code = task_code_for(DEFAULT_ENV)
    else:
        parts = parts if isinstance(parts, Parts) else Parts(**parts)
        env = make_env(parts.env_id, parts.env_kwargs)
        policy, critic = make_runners(parts, env)
        core = NoiseSteeringEnv(
            env, policy, critic, HostConfig(execute_steps=cfg.execute_steps), value_in_obs=cfg.value_in_obs
        )
        code = task_code_for(parts.env_id)
    return SuccessBonus(
        NoiseBound(SteeringObs(core, code), cfg.noise_bound), cfg.success_bonus, cfg.env_reward_scale, cfg.chunk_penalty
    )


# ------------------------------------------------------------------ training
class WallClockBudget(BaseCallback):
    """Stops ``learn`` once ``seconds`` of wall time have passed since training began."""

    def __init__(self, seconds: float):
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        self.seconds = float(seconds)
        self._t0 = 0.0

    def _on_training_start(self) -> None:
        self._t0 = time.perf_counter()

    def _on_step(self) -> bool:
        return time.perf_counter() - self._t0 < self.seconds


@dataclass(frozen=True)
class TrainStats:
    """What a training run used."""

    steps: int
    """SAC steps taken (one step = one chunk)."""
    episodes: int
    """Training episodes begun (episode seeds ``episode_seed(seed, i)`` for i below this)."""
    seconds: float
    """Wall time of ``learn``."""


def sac_entropy(ent_coef: str | float, target_entropy: str | float = "auto") -> tuple[str | float, str | float]:
    """SB3's ``ent_coef`` and ``target_entropy`` from their command-line forms; ValueError names the one that is wrong."""
    try:
        ent_coef = float(ent_coef)
    except ValueError:
        if not str(ent_coef).startswith("auto"):
            raise ValueError(f"ent_coef: expected a number, 'auto' or 'auto_<init>', got {ent_coef!r}") from None
    if target_entropy != "auto":
        try:
            target_entropy = float(target_entropy)
        except ValueError:
            raise ValueError(f"target_entropy: expected a number or 'auto', got {target_entropy!r}") from None
    return ent_coef, target_entropy


def train_sac(env: gym.Env, timesteps: int, max_seconds: float, seed: int, learning_starts: int = 1000, ent_coef: str | float = "auto", log_interval: int = 20,
              verbose: int = 1, target_entropy: float | str = "auto", tensorboard=None) -> tuple[SAC, TrainStats]:  # fmt: skip
    """SB3 SAC (MlpPolicy, its defaults otherwise) on ``env`` for ``timesteps`` steps or ``max_seconds``, whichever ends first.

    Args:
        seed: seeds SB3, and is the run seed of the training episodes (the env is reset with it once).
        ent_coef: SAC's entropy coefficient: a number (fixed), or ``"auto"`` / ``"auto_<init>"`` (SB3 tunes it).
        target_entropy: the entropy an ``auto`` coefficient is tuned towards (SB3's ``"auto"``: minus the action
            dimension; DSRL's robomimic runs use 0).
        tensorboard: a directory for SB3's TensorBoard event files (:func:`~rollcap.rollout.learn.logs.sb3_logger`).
    """
    ent_coef, target_entropy = sac_entropy(ent_coef, target_entropy)
    model = SAC(
        "MlpPolicy",
        env,
        learning_starts=learning_starts,
        ent_coef=ent_coef,
        target_entropy=target_entropy,
        seed=seed,
        verbose=verbose,
        device="cpu",
    )
    # SB3's default logger makes a /tmp/SB3-<date> directory for every run, even when it only prints; this one only
    # prints, and writes TensorBoard's event files where it is asked to.
    model.set_logger(sb3_logger(bool(verbose), tensorboard))
    t0 = time.perf_counter()
    model.learn(timesteps, callback=WallClockBudget(max_seconds), log_interval=log_interval)
    seconds = time.perf_counter() - t0
    begun = len(model.get_env().get_attr("episode_returns")[0]) + 1  # Monitor's finished episodes + the running one
    return model, TrainStats(int(model.num_timesteps), begun, seconds)


# ---------------------------------------------------------------- evaluation
class SteeringProbe:
    """The trained agent's deterministic noise as ``act``, recording what it chose: its critic's value and the box's edge.

    Two symptoms of a SAC critic gone wrong show here: Q far above any return the reward allows (it is at most the
    success bonus plus the env's reward), and noise pinned to the box's edge. ``stats()`` summarises every call.
    """

    def __init__(self, model: SAC, bound: float):
        self.model, self.bound = model, float(bound)
        self.q: list[float] = []
        self.saturated: list[float] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        action = self.model.predict(obs, deterministic=True)[0]
        with torch.no_grad():
            o, _ = self.model.policy.obs_to_tensor(obs)
            a = torch.as_tensor(self.model.policy.scale_action(action), dtype=torch.float32).reshape(1, -1)
            q = torch.min(torch.cat(self.model.critic(o, a), dim=1), dim=1).values  # SAC's min over the twins
        self.q.append(float(q[0]))
        self.saturated.append(float(np.mean(np.abs(action) >= 0.99 * self.bound)))
        return action

    def stats(self) -> dict:
        if not self.q:
            return {"chunks": 0}
        q = np.asarray(self.q)
        return {"chunks": len(q), "q_mean": float(q.mean()), "q_p5": float(np.percentile(q, 5)), "q_p95": float(np.percentile(q, 95)),
                "saturated_fraction": float(np.mean(self.saturated))}  # fmt: skip


def steered_successes(
    env: gym.Env, act: Callable[[np.ndarray], np.ndarray], run_seed: int, episodes: int
) -> list[bool]:
    """Success of episodes ``0 .. episodes-1`` of run ``run_seed`` with the noise ``act(obs)`` chooses each chunk."""
    out = []
    obs, info = env.reset(seed=run_seed)
    for i in range(episodes):
        if i:
            obs, info = env.reset()
        if info["rollcap_episode"] != i:
            raise RuntimeError(
                f"expected episode {i} of run {run_seed}, the env started episode {info['rollcap_episode']}"
            )
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(act(obs))
            done = terminated or truncated
        out.append(bool(info["is_success"]))
    return out


def frozen_episodes(env: gym.Env, run_seed: int, episodes: int) -> list[EpisodeEnd]:
    """The same episodes run by the frozen policy on its own derived noise, exactly as ``rollcap run --seed run_seed`` runs them."""
    core = env.unwrapped
    if not isinstance(core, NoiseSteeringEnv):
        raise TypeError(f"expected a NoiseSteeringEnv inside, got {type(core).__name__}")
    host = core.host
    if host.state is not HostState.RESET:
        host.finish("reset")
    return [host.run_episode(i, episode_seed(run_seed, i)) for i in range(episodes)]


@dataclass(frozen=True)
class Comparison:
    """Steered vs frozen success on the same episode seeds, paired episode by episode."""

    run_seed: int
    steered: tuple[bool, ...]
    frozen: tuple[bool, ...]
    zero_noise: tuple[bool, ...] = ()
    """The frozen policy on all-zero noise (about SAC's deterministic action before training), a reference."""

    @property
    def fixed(self) -> int:
        """Episodes the frozen policy failed and steering made succeed."""
        return sum(s and not f for s, f in zip(self.steered, self.frozen))

    @property
    def broken(self) -> int:
        """Episodes the frozen policy solved and steering failed."""
        return sum(f and not s for s, f in zip(self.steered, self.frozen))

    def lines(self) -> list[str]:
        n = len(self.frozen)
        rows = [("steered (SAC, deterministic)", self.steered), ("unsteered (frozen policy)", self.frozen)]
        rows += [("zero noise (reference)", self.zero_noise)] if self.zero_noise else []
        out = [
            f"{name} success: {sum(v)}/{n} = {sum(v) / n:.1%} (95% Wilson CI {wilson(sum(v), n)[1]:.1%}-{wilson(sum(v), n)[2]:.1%})"
            for name, v in rows
        ]
        d, lo, hi = paired_difference(self.fixed, self.broken, n)
        out.append(f"paired: {self.fixed} fixed, {self.broken} broken by steering: {100 * d:+.1f} points (95% CI {100 * lo:+.1f} to {100 * hi:+.1f}), "
                   f"exact McNemar p = {mcnemar_p(self.fixed, self.broken):.3g}; held-out episode seeds episode_seed({self.run_seed}, i), i < {n}")  # fmt: skip
        return out

    def to_json(self) -> dict:
        n = len(self.frozen)
        return {
            "run_seed": self.run_seed, "episodes": n, "episode_seeds": [episode_seed(self.run_seed, i) for i in range(n)],
            "steered_success": sum(self.steered), "frozen_success": sum(self.frozen), "zero_noise_success": sum(self.zero_noise),
            "fixed": self.fixed, "broken": self.broken, "mcnemar_p": mcnemar_p(self.fixed, self.broken),
            "difference_and_95ci": paired_difference(self.fixed, self.broken, n),
            "steered": list(self.steered), "frozen": list(self.frozen), "zero_noise": list(self.zero_noise),
        }  # fmt: skip


def compare(
    env: gym.Env, act: Callable[[np.ndarray], np.ndarray], run_seed: int, episodes: int, zero_noise: bool = True
) -> Comparison:
    """The agent's ``act`` against the frozen policy (and, with ``zero_noise``, all-zero noise) on episodes ``0 .. episodes-1`` of ``run_seed``."""
    zeros = np.zeros(env.action_space.shape, np.float32)
    steered = steered_successes(env, act, run_seed, episodes)
    frozen = [end.success for end in frozen_episodes(env, run_seed, episodes)]
    zero = steered_successes(env, lambda obs: zeros, run_seed, episodes) if zero_noise else []
    return Comparison(run_seed, tuple(steered), tuple(frozen), tuple(zero))
