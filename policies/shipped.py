"""The shipped policy checkpoints, by path (no torch: a spec names them as defaults)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CHECKPOINT = Path(__file__).parent / "weights" / "pushblock_policy.json"
"""The built-in task's policy (images + instruction + proprio)."""
MT10_CHECKPOINT = DEFAULT_CHECKPOINT.parent / "mt10_policy.json"
"""The shipped MetaWorld MT10 policy (state + instruction; ``python3 -m rollcap.rollout.learn.mt10``)."""
