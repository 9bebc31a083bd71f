"""RecapConfig: every knob of one RECAP iteration (the CLI's flags are derived from it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollcap.rollout.errors import ConfigError


@dataclass(frozen=True)
class RecapConfig:
    """One RECAP iteration: data, labels, fine-tuning and evaluation budgets (recorded in the manifest)."""

    seed: int = 0
    """Iteration seed: demonstrations, batches, the validation and held-out seed streams derive from it."""
    policy: Path | None = None
    """Policy to improve (default: the shipped one)."""
    critic: Path | None = None
    """Critic to refit (default: the shipped one)."""
    demos: int = 200
    """Shipped demonstrations regenerated from the scripted expert and mixed in (0: none)."""
    critic_steps: int = 300
    """Optimiser steps refitting the critic (0: keep it as it is)."""
    policy_steps: int = 800
    """Optimiser steps fine-tuning the policy."""
    batch: int = 64
    """Batch size for both models."""
    critic_lr: float = 3e-4
    """AdamW learning rate of the critic refit (cosine decay)."""
    policy_lr: float = 1e-4
    """AdamW learning rate of the policy fine-tune (cosine decay)."""
    windows: Literal["steps", "boundaries"] = "boundaries"
    """Policy labels: every step with the actions executed from it, or chunk boundaries only with the chunk run from there."""
    n_step: int = 8
    """N of the N-step advantage A_t = sum of N rewards + V(o_t+N) - V(o_t) (Monte-Carlo when the episode ends first)."""
    percentile: float = 60.0
    """Advantage threshold per task: steps above this percentile of the task's advantages are positive."""
    betas: tuple[str, ...] = ("1.0", "1.5", "2.5")
    """Classifier-free guidance weights tried on the validation seeds; the best is deployed."""
    val_episodes: int = 60
    """Validation episodes per guidance weight, at the largest execute_steps (a seed stream of their own; 0: deploy the first beta)."""
    eval_episodes: int = 200
    """Held-out episodes per setting, before and after (a seed stream never used in collection)."""
    execute_steps: tuple[str, ...] = ("4", "8")
    """Settings evaluated before vs after (actions executed per chunk)."""
    threads: int = 1
    """Intra-op threads for training and evaluation."""

    def __post_init__(self):
        for name in ("demos", "critic_steps", "val_episodes"):
            if not _int(getattr(self, name)) or getattr(self, name) < 0:
                raise ConfigError(name, f"expected an integer >= 0, got {getattr(self, name)!r}")
        for name in ("seed",):
            if not _int(self.seed) or self.seed < 0:
                raise ConfigError(name, f"expected a non-negative integer, got {self.seed!r}")
        for name in ("policy_steps", "batch", "n_step", "eval_episodes", "threads"):
            if not _int(getattr(self, name)) or getattr(self, name) < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {getattr(self, name)!r}")
        for name in ("critic_lr", "policy_lr"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1:
                raise ConfigError(name, f"expected a learning rate in (0, 1), got {v!r}")
        if (
            not isinstance(self.percentile, (int, float))
            or isinstance(self.percentile, bool)
            or not 0 <= self.percentile < 100
        ):
            raise ConfigError("percentile", f"expected a number in [0, 100), got {self.percentile!r}")
        if self.windows not in ("steps", "boundaries"):
            raise ConfigError("windows", f"expected steps or boundaries, got {self.windows!r}")
        object.__setattr__(self, "betas", _numbers("betas", self.betas, float, 0.0))
        object.__setattr__(self, "execute_steps", _numbers("execute_steps", self.execute_steps, int, 1))
        for name in ("policy", "critic"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _numbers(name: str, values, kind, low) -> tuple:
    """A comma list (from the CLI) or a tuple of numbers -> a tuple of ``kind`` >= ``low``, at least one, no repeats."""
    items = (
        tuple(x for x in values.split(",") if x)
        if isinstance(values, str)
        else (values,)
        if isinstance(values, (int, float))
        else tuple(values)
    )
    try:
        out = tuple(kind(float(v)) if kind is int and float(v) == int(float(v)) else kind(v) for v in items)
    except (TypeError, ValueError):
        raise ConfigError(
            name, f"expected a comma list of {kind.__name__}s, got {','.join(map(str, items))!r}"
        ) from None
    if not out or len(set(out)) != len(out) or any(not v >= low for v in out):
        raise ConfigError(
            name,
            f"expected one or more distinct {kind.__name__}s >= {low}, got {','.join(map(str, items)) or 'nothing'!r}",
        )
    return out
