"""Branching rollouts: N continuations from a chunk boundary of a recorded episode, and their Monte-Carlo value.

A recorded episode (npz or HDF5) is put back at the start of chunk ``K``
(:func:`boundaries`): the env is reset from the episode seed, the recorded
initial exact state restored, and the recorded actions of steps ``0 .. t_K-1``
applied, each step's physics row checked against the recording. No policy or
critic runs for that prefix. Its exact state then (physics, RNG, task and step
counters) is the boundary; restoring it is one ``set_state`` plus the host's
episode-initial capsule (:mod:`rollcap.rollout.resume`), so every branch costs
a restore and its continuation only, never the prefix again.

From the boundary the host runs (:func:`run_branches`):

- the **control** branch (index 0): the parent's own noise, so it must
  reproduce the parent's continuation byte for byte (:func:`continuation_diff`);
- branches ``1 .. N``: fresh noise from :func:`~rollcap.rollout.seeding.branch_seed`
  (parent seed, ``K``, branch index).

Each is recorded as an episode of its own (index = branch index) whose initial
state is the boundary and whose ``origin`` names the parent (file, episode,
chunk, step, branch, noise), so ``rollcap replay`` checks each one alone.

Monte-Carlo value (:func:`mc_value`): the branches' mean return and success
rate with 95% intervals, and the mean of the critic's own target
(``-steps_to_success / max_steps``, ``-1`` on failure, as in
:mod:`rollcap.rollout.learn.training`) beside the critic's value at the boundary.
:mod:`rollcap.rollout.offline.calibrate` compares the two over many boundaries.

Imports point downward: this module knows ``build``, ``config``, ``host``,
``resume``, ``replay``, ``recording``, ``seeding`` and ``envs``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rollcap.envs import exact_state_of, physics_row
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.recording.codec import TIMINGS
from rollcap.rollout.recording.recorder import records_equal
from rollcap.rollout.protocols import observation_at
from rollcap.rollout.offline.deployment import fingerprint_diff
from rollcap.rollout.resume import Resume, offset_of
from rollcap.rollout.seeding import branch_seed
from rollcap.rollout.stats import wilson


class PrefixDiverged(ValueError):
    """Re-applying a recording's actions did not reproduce its physics states: no exact boundary exists."""


# ------------------------------------------------------------ the boundary
def check_branchable(rec: EpisodeRecord, env, parent: str = "") -> None:
    """Refuse an episode no boundary of which can be put back: no exact state, or real-time chunking (cheap: runs nothing).

    Raises:
        ConfigError: naming the file (``parent``) and the episode.
    """
    where = f"{parent}: " if parent else ""
    if "rtc_carried" in rec.chunks:
        raise ConfigError(
            "chunk",
            f"{where}episode {rec.index} used real-time chunking; branching it is not supported yet (the chunk its policy carries is not restored at a boundary)",
        )
    if exact_state_of(env) is None or not rec.initial_state:
        raise ConfigError("env_id", f"{where}episode {rec.index} ({rec.env_id}) has no exact state to branch from")


def boundaries(rec: EpisodeRecord, env, chunks: Iterable[int], parent: str = "") -> dict[int, Resume]:
    """The boundaries at the start of ``chunks`` of ``rec``, each a :class:`Resume` (one pass over the prefix).

    Args:
        rec: the parent episode (its env must have exact state).
        env: an env built like the recording's (``make_env(rec.env_id, rec.env_kwargs)``).
        chunks: chunk indices ``0 <= K < rec.num_chunks``.
        parent: the parent's file, recorded in each branch's origin.

    Raises:
        ConfigError: a chunk out of range, an episode without exact state, or one with real-time chunking.
        PrefixDiverged: a re-applied step's physics state differs from the recording's.
    """
    wanted = sorted({int(k) for k in chunks})
    if not wanted:
        return {}
    where = f"{parent}: " if parent else ""
    if wanted[0] < 0 or wanted[-1] >= rec.num_chunks:
        raise ConfigError(
            "chunk",
            f"{where}episode {rec.index} has chunks 0..{rec.num_chunks - 1}, got {wanted[-1] if wanted[-1] >= 0 else wanted[0]}",
        )
    check_branchable(rec, env, parent)
    layer = exact_state_of(env)
    starts = rec.chunks["chunk_start"]
    values = tuple(float(v) for v in rec.chunks["critic_value"])
    base = offset_of(rec)  # a parent that itself began mid-way (a branch, a retry): counts continue from there
    env.reset(seed=rec.seed)
    layer.set_state(rec.initial_state)
    out, t = {}, 0
    for k in wanted:
        target = int(starts[k])
        while t < target:
            if physics_row(layer.get_state()).tobytes() != rec.steps["states"][t].tobytes():
                raise PrefixDiverged(
                    f"episode {rec.index}: re-applying the recorded actions diverged at step {t} (physics state); the env differs from the recording's"
                )
            env.step(rec.steps["actions"][t])
            t += 1
        prior = base.prior_values + values[:k]
        origin = {"parent": parent, "episode": rec.index, "chunk": k, "step": t, "prior_values": list(prior)}
        if base.chunk or base.step:
            origin["offset"] = [base.chunk, base.step]
        out[k] = Resume(
            layer.get_state(), observation_at(rec, t), base.chunk + k, base.step + t, origin, prior_values=prior
        )
    return out


def branch_resume(at: Resume, rec: EpisodeRecord, branch: int, seed: int | None = None) -> tuple[int, Resume]:
    """The seed and :class:`Resume` of branch ``branch`` at boundary ``at`` (0: the control, with the parent's noise).

    A seeded branch's seed is :func:`~rollcap.rollout.seeding.branch_seed` of
    (``seed``, default the parent's episode seed; the chunk; the branch).
    """
    k = int(at.origin["chunk"])  # in the parent's own count
    if branch == 0:
        return rec.seed, dataclasses.replace(
            at, noise=rec.chunks["noise"][k:], origin={**at.origin, "branch": 0, "noise": "parent"}
        )
    base = rec.seed if seed is None else int(seed)
    return branch_seed(base, k, branch), dataclasses.replace(
        at, origin={**at.origin, "branch": branch, "noise": "seed"}
    )


# ------------------------------------------------------------ the check
def continuation(parent: EpisodeRecord, chunk: int, like: EpisodeRecord) -> EpisodeRecord:
    """The part of ``parent`` from chunk ``chunk`` on, as the record a control branch ``like`` must equal.

    Index, seed, origin, initial state and the (wall-clock) timings are
    ``like``'s, and its config when it is the parent's read by this version
    (a parent recorded before a config field existed lacks it); everything
    else is the parent's, steps and chunks sliced and ``chunk_start`` shifted
    to the branch's own step count.
    """
    t = int(parent.chunks["chunk_start"][chunk])
    chunks = {k: v[chunk:] for k, v in parent.chunks.items()}
    chunks["chunk_start"] = chunks["chunk_start"] - t
    for name in TIMINGS:
        key = name.split("/", 1)[1]
        chunks[key] = like.chunks[key]
    from rollcap.rollout.config import HostConfig

    same = HostConfig.from_json(parent.config) == HostConfig.from_json(
        like.config
    )  # fields added since the parent was recorded, at their defaults
    return dataclasses.replace(
        parent, index=like.index, seed=like.seed, origin=like.origin, initial_state=like.initial_state, config=like.config if same else parent.config,
        obs={k: v[t:] for k, v in parent.obs.items()} if t < parent.num_steps else {}, steps={k: v[t:] for k, v in parent.steps.items()}, chunks=chunks,
    )  # fmt: skip


def continuation_diff(parent: EpisodeRecord, chunk: int, control: EpisodeRecord) -> str | None:
    """None if ``control`` reproduces ``parent`` from chunk ``chunk`` on byte for byte, else the first difference."""
    try:
        expected = continuation(parent, chunk, control)
    except (KeyError, ValueError) as err:  # shapes that cannot even be aligned
        return f"cannot align: {err}"
    return records_equal(expected, control)


# ------------------------------------------------------------ MC values
def max_steps_of(rec: EpisodeRecord, env=None, source: str = "") -> int:
    """The episode step limit the critic's target divides by: the recorded env's ``max_steps`` or time limit, else ``env``'s.

    Raises:
        ConfigError: neither the recording nor ``env`` has one (``source``: the file, named in the message).
    """
    fp = rec.fingerprints.get("env", {})
    if "max_steps" in fp.get("dynamics", {}):
        return int(fp["dynamics"]["max_steps"])
    limits = [
        int(n) for n in fp.get("time_limits") or () if n
    ]  # gymnasium TimeLimit wrappers (an adapted env's fingerprint)
    limits += (
        [int(fp["step_limit"])] if fp.get("step_limit") else []
    )  # an adapted env that truncates itself (MetaWorld)
    if limits:
        return min(limits)
    limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
    if limit:
        return int(limit)
    where = f"{source}: " if source else ""
    raise ConfigError("env_id", f"{where}episode {rec.index} ({rec.env_id}) has no step limit (none recorded in its env fingerprint, no TimeLimit), "
                      "and the critic's value target is -steps/limit: episodes of an env without one cannot be used")  # fmt: skip


def value_target(rec: EpisodeRecord, max_steps: int) -> float:
    """The critic's training target for a continuation: ``-steps_to_success / max_steps``, or ``-1`` without success."""
    return -rec.num_steps / max_steps if rec.success else -1.0


def _mean_ci(x: np.ndarray) -> tuple[float, float | None, float | None]:
    """The mean and its 95% normal interval; one sample has none (``None`` bounds)."""
    m = float(x.mean())
    if len(x) < 2:
        return m, None, None
    half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, m - half, m + half


def _with_ci(t: tuple, fmt: str) -> str:
    return f"{t[0]:{fmt}}" + (f" [{t[1]:{fmt}}, {t[2]:{fmt}}]" if t[1] is not None else "")


@dataclass
class MCValue:
    """A boundary's Monte-Carlo value over its branches, beside the critic's value there (intervals: 95%)."""

    episode: int
    chunk: int
    n: int
    critic: float
    """The critic's value recorded at the boundary."""
    value: tuple[float, float | None, float | None]
    """Mean of :func:`value_target` over the branches, and its interval (the critic's scale; none from one branch)."""
    success: tuple[float, float, float]
    """Success rate and its Wilson interval."""
    ret: tuple[float, float | None, float | None]
    """Mean return (sum of rewards of the continuation) and its interval (none from one branch)."""

    def line(self) -> str:
        v, s, r = self.value, self.success, self.ret
        over = f"over {self.n} branches" if self.n > 1 else "over 1 branch (no interval for the mean of one)"
        return (f"episode {self.episode} chunk {self.chunk}: critic {self.critic:+.3f} | MC value {_with_ci(v, '+.3f')}"
                f" | success {s[0]:.0%} [{s[1]:.0%}, {s[2]:.0%}] | return {_with_ci(r, '+.2f')} {over}")  # fmt: skip

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def mc_value(parent: EpisodeRecord, chunk: int, branches: list[EpisodeRecord], max_steps: int) -> MCValue:
    """The Monte-Carlo value at ``chunk`` of ``parent`` over ``branches`` (the control included when given)."""
    if not branches:
        raise ValueError("mc_value: no branches")
    targets = np.array([value_target(b, max_steps) for b in branches])
    returns = np.array([float(b.steps["rewards"].sum()) for b in branches])
    wins = sum(bool(b.success) for b in branches)
    return MCValue(
        parent.index,
        chunk,
        len(branches),
        float(parent.chunks["critic_value"][chunk]),
        _mean_ci(targets),
        wilson(wins, len(branches)),
        _mean_ci(returns),
    )


# ------------------------------------------------------------ running
@dataclass
class BranchResult:
    """What :func:`run_branches` did: the branch records (control first when run), the check and the value."""

    records: list[EpisodeRecord]
    mc: MCValue
    control_diff: str | None = None
    """None: the control reproduced the parent (or was not run); else the first difference."""
    fingerprint_diff: list[str] = field(default_factory=list)
    """Fields where the runners differ from the recording's (the control can then not be exact)."""
    restore_s: float = float("nan")
    """Seconds to put the boundary back (prefix re-applied once; see :func:`boundaries`)."""
    wall_s: float = float("nan")

    @property
    def control(self) -> EpisodeRecord | None:
        return next((r for r in self.records if r.origin and r.origin.get("branch") == 0), None)

    def summary(self) -> dict:
        """JSON-able: the value, the check and one row per branch."""
        rows = [{"index": r.index, "seed": r.seed, "branch": r.origin["branch"], "noise": r.origin["noise"], "steps": r.num_steps,
                 "success": bool(r.success), "stop_reason": r.stop_reason, "return": float(r.steps["rewards"].sum())} for r in self.records]  # fmt: skip
        control = (
            "not run"
            if self.control is None
            else ("exact" if self.control_diff is None else f"DIVERGED: {self.control_diff}")
        )
        if self.control is not None and self.fingerprint_diff:
            control = f"not comparable (fingerprint differs: {', '.join(self.fingerprint_diff[:4])})" + (
                "" if self.control_diff else "; matched anyway"
            )
        return {
            "mc": self.mc.to_json(),
            "control": control,
            "branches": rows,
            "restore_s": self.restore_s,
            "wall_s": self.wall_s,
        }


def run_branches(
    host,
    rec: EpisodeRecord,
    chunk: int,
    n: int,
    *,
    control: bool = True,
    parent: str = "",
    at: Resume | None = None,
    pool=None,
    recorder=None,
    seed: int | None = None,
) -> BranchResult:
    """Run the control (optional) and ``n`` seeded branches of ``rec`` from ``chunk`` on ``host`` (or on a Ray ``pool``).

    Args:
        host: a :class:`~rollcap.rollout.host.RolloutHost` over an env built like
            the recording's, with the recording's config.
        at: the boundary, when already computed (:func:`boundaries`).
        pool: an :class:`~rollcap.rollout.ray.actors.ActorPool` of :class:`BranchActor`:
            the branches run on its actors (the boundary is still computed here).
        recorder: an :class:`~rollcap.rollout.recording.EpisodeRecorder`; every
            branch is written to it, in branch order.
        seed: derive the branch seeds from this instead of the parent's seed.
    """
    if n < 0 or (n == 0 and not control):
        raise ConfigError(
            "n", f"expected at least one branch, got `n={n}`{' without the control' if not control else ''}"
        )
    max_steps = max_steps_of(rec, host.env, parent)  # before anything runs
    t0 = time.perf_counter()
    if at is None:
        at = boundaries(rec, host.env, [chunk], parent)[chunk]
    restore_s = time.perf_counter() - t0
    fp = fingerprint_diff(rec.fingerprints.get("policy", {}), host.policy.state_fingerprint())
    if host.critic is not None and "critic" in rec.fingerprints:
        fp += [f"critic.{k}" for k in fingerprint_diff(rec.fingerprints["critic"], host.critic.state_fingerprint())]
    todo = [branch_resume(at, rec, b, seed) + (b,) for b in range(0 if control else 1, n + 1)]
    if pool is None:
        records = [host.run_episode(b, seed, resume).record for seed, resume, b in todo]
    else:
        got = {
            item[2]: r
            for item, r in pool.map(
                lambda h, item: h.branch.remote(item[2], item[0], host.config, item[1]), todo, key=lambda item: item[2]
            )
        }
        if pool.failed:
            raise RuntimeError(f"branches failed on the actors: {pool.failed}")
        records = [got[b] for _, _, b in todo]
    for r in records if recorder is not None else ():
        recorder.write(r)
    result = BranchResult(records, mc_value(rec, chunk, records, max_steps), fingerprint_diff=fp, restore_s=restore_s)
    if control:
        result.control_diff = continuation_diff(rec, chunk, records[0])
    result.wall_s = time.perf_counter() - t0
    return result
