"""The shipped critic checkpoints, by path (no torch: a spec names them as defaults)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CHECKPOINT = Path(__file__).parent / "weights" / "pushblock_critic.json"
"""The built-in task's critic."""
MT10_CHECKPOINT = DEFAULT_CHECKPOINT.parent / "mt10_critic.json"
"""The shipped MetaWorld MT10 critic (trained on the MT10 policy's rollouts; ``python3 -m rollcap.rollout.learn.mt10_critic``)."""
