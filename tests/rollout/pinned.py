"""Pinned placements: the digests of the same runs wherever their slots lived, taken before issue 56's refactor.

``golden/placements.json`` holds, for one deployment fingerprint (the shipped policy's, as
``test_golden.py`` compares it), the episode digests (:func:`~rollcap.rollout.recording.episode_digest`)
of: the golden runs (batch 1, one host), a run at ``envs=8`` in this process, the same run on 2 env workers,
a run on 2 Ray actors, and one on 2 actors at ``envs=4``. Where the fingerprint differs the pinned
digests are not comparable (the test says so); the equalities between placements hold on any machine.

Regenerate (only when a change is *meant* to alter recordings, and say so in the commit):
``ROLLCAP_WRITE_PINNED=1 python -m pytest tests/rollout/test_pinned.py tests/rollout/ray/test_pinned_actors.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import rollcap
from rollcap.rollout.recording import episode_digest

PINNED = Path(__file__).parent / "golden" / "placements.json"
BATCH_RUN = {"episodes": 12, "seed": 3, "max_chunks": 4, "critic_threshold": -0.55, "critic_patience": 1}
"""The batch-8 run (in process and on 2 env workers): critic stops and chunk limits, slots refilled mid-run."""
ACTOR_RUN = {"episodes": 4, "seed": 5, "max_chunks": 3}
"""The 2-actor runs (at batch 1, and at ``envs=4`` with 8 episodes)."""


def fingerprint() -> dict:
    """The shipped policy's fingerprint at batch 1, as ``test_golden.py`` compares it."""
    from tests.rollout.test_golden import _comparable
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_runners

    policy, critic = make_runners(Parts())
    try:
        return _comparable(policy.state_fingerprint())
    finally:
        policy.close()
        critic.close()


def run_digests(out: Path, episodes: int, **options) -> dict[str, str]:
    """``rollcap.run`` into ``out``; every episode's digest as read back from disk, by index (JSON keys)."""
    rollcap.run(episodes, out=out, progress=False, **options)
    return {str(r.index): episode_digest(r) for r in rollcap.load(out)}


def check(name: str, digests: dict[str, str]) -> None:
    """Compare ``digests`` with the pinned run ``name`` (or pin it with ``ROLLCAP_WRITE_PINNED=1``)."""
    fp = fingerprint()
    pinned = json.loads(PINNED.read_text()) if PINNED.is_file() else {"fingerprint": fp, "runs": {}}
    if os.environ.get("ROLLCAP_WRITE_PINNED"):
        if pinned["fingerprint"] != fp:
            pinned = {"fingerprint": fp, "runs": {}}
        pinned["runs"][name] = digests
        PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
        return
    if pinned["fingerprint"] != fp:
        differ = sorted(k for k in set(fp) | set(pinned["fingerprint"]) if fp.get(k) != pinned["fingerprint"].get(k))
        pytest.skip(f"placements were pinned on another deployment fingerprint (differs in {differ})")
    assert name in pinned["runs"], f"{name}: not pinned (ROLLCAP_WRITE_PINNED=1)"
    assert digests == pinned["runs"][name], f"{name}: the episodes' bytes changed"
