"""HostConfig: when episodes stop and how a run is seeded (recorded with every episode).

Every field has a docstring; the CLI's flags are derived from them
(:mod:`rollcap.rollout.options`). A bad value raises :class:`ConfigError`
naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rollcap.rollout.errors import ConfigError
from rollcap.rollout.predicates import CriticBelow, MaxChunks, MaxSeconds, NonFiniteAction, StopPredicate


MAX_ENVS = 1024
"""The largest batch (``envs``) a run or a recording may have."""
BYTES = {"bytes": True}
"""A field's metadata: an episode's bytes depend on it (it is recorded with the episode, or in the runners'
fingerprint); :func:`rollcap.rollout.spec.byte_fields` lists these fields."""


@dataclass(frozen=True)
class HostConfig:
    """When episodes stop, and how the run is seeded (recorded with every episode)."""

    seed: int = field(default=0, metadata=BYTES)
    """Run seed; episode i uses a seed derived from it and i."""
    critic_threshold: float | None = field(default=None, metadata=BYTES)
    """Stop an episode when the critic value stays below this, in [-1, 0] (None: never)."""
    critic_patience: int = field(default=2, metadata=BYTES)
    """... for this many consecutive chunks."""
    max_chunks: int | None = field(default=None, metadata=BYTES)
    """Stop an episode before this chunk index (None: the env's own time limit)."""
    max_seconds: float | None = field(default=None, metadata=BYTES)
    """Wall-clock limit per episode in seconds (not replay-exact; None: off)."""
    execute_steps: int | None = field(default=None, metadata=BYTES)
    """Actions of each chunk executed before re-planning (None: the policy's own setting).

    Actions of each chunk executed before re-planning (None: the policy's own setting); with real-time chunking, the execution horizon s."""
    chunking: Literal["sync", "naive", "rtc"] = field(default="sync", metadata=BYTES)
    """sync: the env waits for each chunk; naive / rtc: the next chunk is inferred while this one executes.

    sync: the env waits for each chunk; naive / rtc: the next chunk is inferred while inference_delay actions of the current one execute (naive: no constraint on the new chunk; rtc: its first actions are pinned to those, see docs/design-notes.md). naive / rtc need a policy that carries a prefix (RTCPolicyRunner)."""
    inference_delay: int = field(default=0, metadata=BYTES)
    """Real-time chunking's delay d: the next chunk's inference starts d env steps before this one runs out.

    Real-time chunking's delay d in env steps: inference of the next chunk starts d steps before the current one's execute_steps run out (0 <= d <= execute_steps, d + execute_steps <= the chunk length; 0 with sync)."""
    rtc_mask: Literal["hard", "soft"] = field(default="hard", metadata=BYTES)
    """With chunking rtc, which actions of the new chunk are guided: hard (those run during inference) or soft.

    With chunking rtc, which actions of the new chunk are guided: hard pins the inference_delay actions that execute during inference; soft also pulls the rest of the overlap towards the previous plan with the RTC paper's decaying weights (measured worse here: docs/design-notes.md). A prefix-conditioned checkpoint (--policy policies/weights/pushblock_policy_prefix.json) pins them by hard inpainting instead of guidance, hard only."""
    control_period_s: float | None = field(default=None, metadata=BYTES)
    """Simulated control clock: each env step waits for its tick of this period in seconds (None: off).

    Simulated control clock: every env step waits for its tick of this period in seconds, and a late step counts as stall (not replay-relevant; None: step as fast as possible)."""

    def __post_init__(self):
        def bad(name: str, why: str):
            raise ConfigError(name, f"{why}, got {getattr(self, name)!r}")

        if not _is_int(self.seed) or self.seed < 0:
            bad("seed", "expected a non-negative integer")
        if self.execute_steps is not None and (not _is_int(self.execute_steps) or self.execute_steps < 1):
            bad("execute_steps", "expected an integer >= 1")
        if self.chunking not in ("sync", "naive", "rtc"):
            bad("chunking", "expected sync, naive or rtc")
        if not _is_int(self.inference_delay) or self.inference_delay < 0:
            bad("inference_delay", "expected an integer >= 0")
        if self.rtc_mask not in ("hard", "soft"):
            bad("rtc_mask", "expected hard or soft")
        if self.chunking == "sync" and self.inference_delay:
            bad("inference_delay", "is for chunking naive or rtc (sync waits for every chunk)")
        if self.control_period_s is not None and not (
            _is_num(self.control_period_s) and 0 < self.control_period_s < float("inf")
        ):
            bad("control_period_s", "expected a finite number of seconds > 0")
        if not _is_int(self.critic_patience) or self.critic_patience < 1:
            bad("critic_patience", "expected an integer >= 1")
        if self.max_chunks is not None and (not _is_int(self.max_chunks) or self.max_chunks < 1):
            bad("max_chunks", "expected an integer >= 1")
        if self.max_seconds is not None and not (_is_num(self.max_seconds) and 0 < self.max_seconds < float("inf")):
            bad("max_seconds", "expected a finite number of seconds > 0")
        if self.critic_threshold is not None and not (
            _is_num(self.critic_threshold) and -1.0 <= self.critic_threshold <= 0.0
        ):
            bad("critic_threshold", "critic values live in [-1, 0]")

    @classmethod
    def from_json(cls, data: dict) -> HostConfig:
        """The config a recording was made with (unknown keys from newer versions ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def for_policy(self, policy) -> HostConfig:
        """This config as an episode of ``policy`` records it: ``execute_steps`` None resolved to the policy's own
        setting (its ``execute_steps``, else its chunk length). The one place the default is resolved."""
        if self.execute_steps is not None:
            return self
        return dataclasses.replace(self, execute_steps=int(getattr(policy, "execute_steps", policy.chunk_shape[0])))

    def predicates(self) -> list[StopPredicate]:
        preds: list[StopPredicate] = [NonFiniteAction()]
        if self.max_chunks is not None:
            preds.append(MaxChunks(self.max_chunks))
        if self.max_seconds is not None:
            preds.append(MaxSeconds(self.max_seconds))
        if self.critic_threshold is not None:
            preds.append(CriticBelow(self.critic_threshold, self.critic_patience))
        return preds


def check_batched_host(config: HostConfig) -> None:
    """The host's rules at batch N > 1: synchronous chunking, no control period (ConfigError naming the field)."""
    if config.chunking != "sync":
        raise ConfigError("chunking", f"a batched run (envs > 1) chunks synchronously, got {config.chunking!r}")
    if config.control_period_s is not None:
        raise ConfigError(
            "control_period_s", "a batched run (envs > 1) steps its envs in lockstep, unpaced; drop the control period"
        )


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and v == v
