"""Golden recordings: the built-in task's episodes for fixed seeds stay byte-identical across refactors.

``golden/pushblock-<cpu>.json`` holds, per episode, a SHA-256 of every deterministic field (timings aside) and of
each table separately, taken with the shipped policy and critic on one kind of machine: one file per CPU kind
(:func:`rollcap.kernels.fingerprint.cpu_identity`), because MKL's GEMM kernels, and so the policy's bits, follow the
CPU's vendor and model. The digests are compared on a machine whose runner fingerprint matches the one stored in its
kind's file (CPU, capability, torch and numpy versions, ...); elsewhere the test skips and says why. The initial
states, which no GEMM touches, are compared against every kind's file on every machine.

Record this machine kind's file (only when a change is *meant* to alter recordings, and say so in the commit; a new
machine kind is such a change): ``ROLLCAP_WRITE_GOLDEN=1 python3 -m pytest tests/rollout/test_golden.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
TIMING = ("latency_policy_s", "latency_critic_s", "latency_boundary_s")
# (run seed, episodes, config): a natural run, critic stops mid-episode and at chunk 0, a chunk limit
RUNS = (
    (7, 3, {}),
    (3, 3, {"critic_threshold": -0.55, "critic_patience": 1}),
    (11, 1, {"critic_threshold": -0.3, "critic_patience": 1}),
    (5, 1, {"max_chunks": 2}),
)
PINNED_CONFIG = ("seed", "critic_threshold", "critic_patience", "max_chunks", "max_seconds", "execute_steps")
"""Config keys whose recorded values are pinned (new keys may be added)."""


def _hash_arrays(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"|{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def content_digests(rec) -> dict[str, str]:
    """Per-table digests of one record's deterministic content."""
    chunks = {k: v for k, v in rec.chunks.items() if k not in TIMING}
    scalars = {
        "index": rec.index,
        "seed": rec.seed,
        "env_id": rec.env_id,
        "env_kwargs": rec.env_kwargs,
        "instruction": rec.instruction,
        "stop_reason": rec.stop_reason,
        "success": bool(rec.success),
        "config": {k: rec.config.get(k) for k in PINNED_CONFIG},
    }
    return {
        "scalars": hashlib.sha256(json.dumps(scalars, sort_keys=True).encode()).hexdigest(),
        "initial_state": _hash_arrays(rec.initial_state),
        "obs": _hash_arrays(rec.obs),
        "final_obs": _hash_arrays(rec.final_obs),
        "steps": _hash_arrays(rec.steps),
        "chunks": _hash_arrays(chunks),
    }


def _record_runs():
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    policy, critic = make_runners(Parts())
    env = make_env()
    out = []
    try:
        for seed, n, kw in RUNS:
            host = RolloutHost(env, policy, critic, HostConfig(seed=seed, **kw))
            for end in host.run(n):
                rec = end.record
                out.append(
                    {
                        "run_seed": seed,
                        "index": rec.index,
                        "stop_reason": rec.stop_reason,
                        "steps": rec.num_steps,
                        "digests": content_digests(rec),
                    }
                )
        return policy.state_fingerprint(), out
    finally:
        policy.close()
        critic.close()


def _comparable(fp: dict) -> dict:
    return {k: v for k, v in fp.items() if k not in ("inputs", "outputs")}


def golden_path(cpu: str) -> Path:
    """This CPU kind's golden file: ``golden/pushblock-genuineintel-6-207.json`` for ``"GenuineIntel 6/207"``."""
    return GOLDEN_DIR / f"pushblock-{re.sub(r'[^a-z0-9]+', '-', cpu.lower()).strip('-')}.json"


@pytest.fixture(scope="module")
def recorded():
    """The golden runs on this machine: (the policy's fingerprint, the episodes' digests)."""
    return _record_runs()


@pytest.mark.slow
def test_builtin_task_recordings_are_byte_identical_to_the_golden(recorded):
    """Every deterministic field of the golden episodes (a natural run and a critic-cut run) is unchanged."""
    fp, episodes = recorded
    path = golden_path(fp["cpu"])
    if os.environ.get("ROLLCAP_WRITE_GOLDEN"):
        path.write_text(
            json.dumps({"fingerprint": _comparable(fp), "episodes": episodes}, indent=1, sort_keys=True) + "\n"
        )
        pytest.skip(f"wrote {path}")
    if not path.exists():
        have = ", ".join(sorted(p.name for p in GOLDEN_DIR.glob("pushblock-*.json")))
        pytest.skip(
            f"no golden recorded on a {fp['cpu']} (have: {have}); the bits follow the CPU kind, so record this kind's "
            f"with ROLLCAP_WRITE_GOLDEN=1 on a tree whose recordings are known good, and commit {path.name}"
        )
    golden = json.loads(path.read_text())
    if _comparable(fp) != golden["fingerprint"]:
        differ = sorted(
            k
            for k in set(golden["fingerprint"]) | set(_comparable(fp))
            if golden["fingerprint"].get(k) != _comparable(fp).get(k)
        )
        pytest.skip(f"{path.name}'s digests were taken on another deployment fingerprint (differs in {differ})")
    assert [(e["run_seed"], e["index"]) for e in episodes] == [(e["run_seed"], e["index"]) for e in golden["episodes"]]
    assert {e["stop_reason"] for e in golden["episodes"]} >= {"critic", "success"}, (
        "golden must cover a critic stop and a success"
    )
    assert any(e["steps"] == 0 for e in golden["episodes"]) and any(
        e["stop_reason"] == "critic" and e["steps"] for e in golden["episodes"]
    )
    for got, want in zip(episodes, golden["episodes"]):
        for table, digest in want["digests"].items():
            assert got["digests"][table] == digest, (
                f"run seed {want['run_seed']} episode {want['index']}: {table} changed"
            )


@pytest.mark.slow
def test_initial_states_are_the_same_on_every_machine_kind(recorded):
    """The episodes' initial sim states (seeded env resets, no GEMM) equal every machine kind's golden."""
    _, episodes = recorded
    files = sorted(GOLDEN_DIR.glob("pushblock-*.json"))
    assert len(files) >= 2, "the goldens should cover more than one machine kind"
    for path in files:
        golden = json.loads(path.read_text())["episodes"]
        assert [e["digests"]["initial_state"] for e in episodes] == [e["digests"]["initial_state"] for e in golden], (
            f"{path.name}: an initial state differs"
        )
