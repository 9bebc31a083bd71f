"""Export a recording's chunk-level transitions for offline RL: one npz, one row per executed chunk.

Offline DSRL (a noise policy learned from the noise each chunk ran with) and chunked offline RL (IQL or Q-learning
over action chunks) read transitions at the chunk boundary, not per step. Each row is one chunk that reached the env
(a chunk stopped at its boundary executed nothing and is no transition), in episode order:

- ``obs/<key>``: the observation at the chunk's boundary (what the policy saw); ``next_obs/<key>``: the one after its
  last step (the next boundary's, or the episode's final observation);
- ``noise`` ``[N, H, A]``: the flow noise the chunk ran with; ``policy_chunk`` ``[N, H, A]``: the policy's chunk;
  ``actions`` ``[N, E, A]``: the actions executed (the agent's or a person's where they replaced the policy's;
  ``E`` the longest chunk, padded with NaN), ``steps`` ``[N]``: how many;
- ``reward`` ``[N]``: the chunk's return, ``sum_t gamma^t r_t`` over its steps (``gamma=1``: the plain sum, the RL
  envs' reward), and ``discount`` = ``gamma ** steps`` (a TD target is ``reward + discount * (1 - terminated) *
  V(next_obs)``);
- ``terminated`` (the task ended in the chunk's last step), ``truncated`` (the episode ended after it otherwise: a
  time limit, a critic stop, the chunk limit), ``done`` (either);
- ``episode``, ``chunk``: the episode's index and the chunk's number in it; ``success``: the episode's outcome;
  ``critic_value``: the recorded critic's value at the boundary (NaN without a critic); ``intervened``: a person
  took over some step of the chunk; ``instruction``: the episode's instruction (text).

Written whole or not at all (beside the target, then renamed), no pickle (every array is numeric, bool or text):
``np.load(path)`` reads it. A recording made with real-time chunking is refused in one line: its chunks overlap in
time, so a chunk's steps are not its own.

Imports point downward: the recording readers (:mod:`.export`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rollcap.rollout.episode import ACTOR_HUMAN, EpisodeRecord
from rollcap.rollout.recording.export import read_run, staged


@dataclass
class ChunkExport:
    """What :func:`export_chunks` wrote."""

    path: Path
    episodes: int
    transitions: int
    skipped: list[int] = field(default_factory=list)
    """Indices of recorded episodes with no executed chunk (nothing to export)."""


def _obs_at(rec: EpisodeRecord, step: int, keys: Iterable[str]) -> dict[str, np.ndarray]:
    src = rec.final_obs if step >= rec.num_steps else {k: v[step] for k, v in rec.obs.items()}
    return {k: np.asarray(src[k]) for k in keys}


def chunk_rows(rec: EpisodeRecord, keys: tuple[str, ...], gamma: float) -> list[dict]:
    """One episode's transitions (one dict per executed chunk)."""
    if "rtc_carried" in rec.chunks:
        raise ValueError(
            f"run_dir: episode {rec.index} was recorded with real-time chunking: its chunks overlap in time, so chunk "
            "transitions need a run with synchronous chunking"
        )
    starts = [int(s) for s in rec.chunks["chunk_start"]]
    ends = starts[1:] + [rec.num_steps]
    executed = [k for k in range(len(starts)) if ends[k] > starts[k]]
    steps, rows = rec.steps, []
    for n, k in enumerate(executed):
        s, e = starts[k], ends[k]
        last = n == len(executed) - 1
        terminated = bool(steps["terminated"][e - 1])
        rewards = np.asarray(steps["rewards"][s:e], np.float64)
        rows.append({
            "obs": _obs_at(rec, s, keys), "next_obs": _obs_at(rec, e, keys),
            "noise": rec.chunks["noise"][k], "policy_chunk": rec.chunks["policy_chunk"][k],
            "actions": np.asarray(steps["actions"][s:e], np.float32), "steps": e - s,
            "reward": float(np.sum(rewards * gamma ** np.arange(e - s))), "discount": float(gamma ** (e - s)),
            "terminated": terminated, "truncated": last and not terminated, "done": last or terminated,
            "episode": rec.index, "chunk": k, "success": bool(rec.success),
            "critic_value": float(rec.chunks["critic_value"][k]),
            "intervened": bool((np.asarray(steps["actor"][s:e]) == ACTOR_HUMAN).any()), "instruction": rec.instruction,
        })  # fmt: skip
    return rows


def _stack(rows: list[dict], keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    width = max(r["steps"] for r in rows)
    action_dim = rows[0]["actions"].shape[1]
    actions = np.full((len(rows), width, action_dim), np.nan, np.float32)
    for i, r in enumerate(rows):
        actions[i, : r["steps"]] = r["actions"]
    out = {f"{side}/{k}": np.stack([r[side][k] for r in rows]) for side in ("obs", "next_obs") for k in keys}
    out["actions"] = actions
    for name, dtype in (("noise", np.float32), ("policy_chunk", np.float32), ("steps", np.int64), ("reward", np.float64),
                        ("discount", np.float64), ("terminated", bool), ("truncated", bool), ("done", bool),
                        ("episode", np.int64), ("chunk", np.int64), ("success", bool), ("critic_value", np.float32),
                        ("intervened", bool)):  # fmt: skip
        out[name] = np.asarray([r[name] for r in rows], dtype)
    out["instruction"] = np.asarray([r["instruction"] for r in rows], dtype=str)
    return out


def export_chunks(run_dir, root, gamma: float = 1.0, obs_keys: tuple[str, ...] | None = None) -> ChunkExport:
    """Write the chunk-level transitions of the recording at ``run_dir`` (a run directory, npz or HDF5 file) to
    ``root`` (a new ``.npz`` file); see the module docstring for its arrays.

    Args:
        gamma: the per-step discount inside a chunk's return, in (0, 1] (1: the plain sum).
        obs_keys: the observation keys to export (default all; e.g. ``("state",)`` leaves the images out).

    Raises:
        ValueError: one line naming the argument (no recording, an existing target, a key the recording lacks, ...).
    """
    root = Path(root)
    if root.suffix != ".npz":
        raise ValueError(f"root: expected a new .npz file, got {root}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
        raise ValueError(f"gamma: expected a number in (0, 1], got {gamma!r}")
    first, records = read_run(run_dir)
    keys = tuple(first.obs) if obs_keys is None else tuple(obs_keys)
    missing = [k for k in keys if k not in first.obs]
    if missing or not keys:
        raise ValueError(f"obs_keys: {missing or list(keys)} not among the recording's keys {sorted(first.obs)}")
    rows, episodes, skipped = [], 0, []
    for rec in records:
        these = chunk_rows(rec, keys, float(gamma))
        if not these:
            skipped.append(rec.index)
            continue
        rows += these
        episodes += 1
    if not rows:
        raise ValueError(f"run_dir: {run_dir} holds no executed chunk")
    arrays = _stack(rows, keys)
    with staged(root, "root") as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    return ChunkExport(root, episodes, len(rows), skipped)
