"""What a flow-RL run is: the task, the algorithm, its budget and streams (:class:`TrainConfig`).

Every field is checked when the config is made; a bad value is a ``ValueError`` whose message starts with the
field's name (the example turns it into one line naming the flag).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rollcap.policies.flow_sde import DEFAULT_NOISE_LEVEL, check_noise_level
from rollcap.rollout.learn.dsrl_eval import TASKS

ALGORITHMS = ("grpo", "ppo")
ADVANTAGES = ("group", "branch")
TRAINED = ("expert", "all")


@dataclass(frozen=True)
class TrainConfig:
    """A flow-RL run (defaults: GRPO on PushBlock at whole 8-action chunks, what a 2-core CPU affords)."""

    task: str = "pushblock"
    """``pushblock`` (the shipped policy, 8 actions a chunk) or ``peg-insert-side`` (the MT10 policy, 4 of 8)."""
    algorithm: str = "grpo"
    """``grpo``: group-relative outcome advantages, no critic; ``ppo``: GAE over chunks with a value head."""
    advantage: str = "group"
    """``group``: every chunk of an episode gets its group-relative outcome (GRPO); ``branch``: VinePPO's idea on
    top, ``branch_k`` continuations from one chunk boundary of each episode give a Monte-Carlo value there, and
    the chunks before and after it get the value's differences (grpo only)."""
    seed: int = 0
    """Training seed: the training and held-in streams, the minibatch order."""
    minutes: float = 60.0
    """Wall-clock budget of training (the held-out evaluation comes after it)."""
    max_iterations: int = 1_000_000
    groups: int = 8
    """Initial states per iteration (capsules), each played by a group."""
    group_size: int = 8
    """Episodes per group (G): they start from one capsule and differ only in their noise."""
    max_start: int = 0
    """0: a group starts at its reset capsule; N: at the boundary of chunk j (drawn in 0..N) of a scout episode the
    current policy plays from it, so a member's chunks are credited with the outcome of a shorter horizon."""
    noise_level: float = DEFAULT_NOISE_LEVEL
    """The Flow-SDE's noise level a."""
    lr: float = 3e-5
    """Adam's learning rate."""
    clip: float = 0.2
    """PPO's ratio clip epsilon."""
    epochs: int = 2
    """Passes over each iteration's chunks."""
    minibatch: int = 64
    """Chunks per gradient step (all K denoising steps of each)."""
    max_grad_norm: float = 1.0
    train: str = "expert"
    """``expert``: the action expert's weights only (the prefix encoder frozen: about half the learner's work);
    ``all``: every weight."""
    normalize: bool = True
    """GRPO: divide each group's centred returns by their std (Dr. GRPO: do not)."""
    chunk_penalty: float = 0.0
    """Subtracted from an episode's return per chunk (0: the return is the outcome, 1 or 0)."""
    gamma: float = 0.99
    """PPO: discount per chunk."""
    lam: float = 0.95
    """PPO: GAE's lambda."""
    value_lr: float = 1e-3
    """PPO: the value head's learning rate."""
    branch_k: int = 4
    """advantage branch: continuations from each episode's branch point."""
    heldin_every: int = 10
    """Score the policy (plain sampler, its own noise) on the held-in stream every this many iterations (and at 0
    and at the end); 0: never, no keep-best."""
    heldin_episodes: int = 64
    heldin_envs: int = 16
    """Envs (batch) of the held-in evaluation's graph."""
    keep_best: bool = True
    """End with the best weights by held-in success (ties: the later), not the last."""
    record_every: int = 10
    """Record every episode of every this many iterations (the first included) with the weights it ran with kept;
    0: record nothing."""
    threads: int = 1
    """Intra-op threads of the updates and of the rollout graph's lane."""
    log_every_s: float = 30.0

    def __post_init__(self):
        _one_of("task", self.task, tuple(TASKS))
        _one_of("algorithm", self.algorithm, ALGORITHMS)
        _one_of("advantage", self.advantage, ADVANTAGES)
        _one_of("train", self.train, TRAINED)
        if self.advantage == "branch" and self.algorithm != "grpo":
            raise ValueError("advantage: branch is grpo's (ppo's chunks take GAE's advantages)")
        if self.advantage == "branch" and self.max_start:
            raise ValueError("advantage: branch splits episodes that start at their reset capsule (max_start 0)")
        for name, lo, hi in (("seed", 0, 999), ("max_iterations", 1, None), ("groups", 1, 256), ("group_size", 1, 256), ("max_start", 0, 64),
                             ("epochs", 1, 100), ("minibatch", 1, 1 << 16), ("branch_k", 1, 64), ("heldin_every", 0, None),
                             ("heldin_episodes", 0, 1000), ("heldin_envs", 1, 256), ("record_every", 0, None),
                             ("threads", 1, 256)):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
                raise ValueError(f"{name}: expected an integer in {lo}..{hi if hi is not None else ''}, got {v!r}")
        if self.groups * self.group_size > 1024:
            raise ValueError(f"group_size: groups x group_size is the rollout's batch, at most 1024, got {self.groups * self.group_size}")  # fmt: skip
        if self.heldin_every and not self.heldin_episodes:
            raise ValueError("heldin_episodes: expected >= 1 with heldin_every > 0")
        for name, lo, hi in (("minutes", 0, math.inf), ("lr", 0, 1), ("clip", 0, 1), ("max_grad_norm", 0, math.inf),
                             ("value_lr", 0, 1), ("log_every_s", -1e-9, math.inf)):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo < v < hi:
                raise ValueError(f"{name}: expected a number in ({lo:g}, {hi:g}), got {v!r}")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{name}: expected a number in [0, 1], got {v!r}")
        v = self.chunk_penalty
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"chunk_penalty: expected a number in [0, 1), got {v!r}")
        for name in ("normalize", "keep_best"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        check_noise_level(self.noise_level)

    @property
    def batch(self) -> int:
        """The rollout graph's batch: one slot per episode of an iteration."""
        return self.groups * self.group_size

    def to_json(self) -> dict:
        return asdict(self)


def _one_of(name: str, value, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
