"""``rollcap bench --only branch``: what a branch costs, against re-running its prefix.

One parent episode of the task is run and recorded in memory; its boundary
``K`` (the middle chunk) is put back once (:func:`~rollcap.rollout.offline.branch.boundaries`:
the recorded actions re-applied, no inference). Then, interleaved:

- **restore**: the env's exact state at ``K`` plus the host's episode-initial
  capsule (what :meth:`RolloutHost.start(at=...)` adds to a reset), and the
  whole ``start(at=...)``;
- **prefix from scratch**: the parent's chunks ``0 .. K-1`` re-run through the
  host with their recorded noise (policy, critic and env), what a branch would
  cost on top of its continuation without a boundary to restore;
- **branches**: ``n`` seeded branches, each a restore and its continuation.

With Ray installed, the same branches on 1 and 2 local actors (Ray's start-up
and the actors' build are excluded; both pools warm up with one branch first);
not with ``--quick``, which also takes the longer of 2 parents instead of 6.
"""

from __future__ import annotations

import time

import numpy as np

from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners


def _prefix_from_scratch(host, rec, k: int) -> None:
    host.start(rec.index, rec.seed)
    for j in range(k):
        host.boundary(rec.chunks["noise"][j])
        host.execute()
    host.finish("bench")


def _ray_branches(parts: Parts, host, rec, k: int, at, n: int, actors: int) -> dict:
    from rollcap.rollout.offline.branch import run_branches
    from rollcap.rollout.ray.branch import BranchActor
    from rollcap.rollout.ray.actors import ActorPool
    from rollcap.rollout.ray.episodes import identity

    t0 = time.perf_counter()
    with ActorPool(parts, host.config, actors, expect=identity(host), actor_cls=BranchActor) as pool:
        start_s = time.perf_counter() - t0
        run_branches(host, rec, k, actors, control=False, at=at, pool=pool, seed=1)  # warm every actor
        t0 = time.perf_counter()
        run_branches(host, rec, k, n, control=False, at=at, pool=pool)
        wall = time.perf_counter() - t0
    return {"actors": actors, "wall_s": wall, "branches_per_s": n / wall, "pool_start_s": start_s}


def bench_branch(parts: Parts, n: int) -> dict:
    from rollcap.capsule.verbs import restore
    from rollcap.rollout.offline.branch import boundaries, run_branches
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)
    host = RolloutHost(env, policy, critic, HostConfig(seed=7))
    quick = n < 100  # rollcap bench --quick
    rec = max(
        (host.run_episode(i).record for i in range(2 if quick else 6)), key=lambda r: r.num_chunks
    )  # a long parent
    k = rec.num_chunks // 2
    t0 = time.perf_counter()
    at = boundaries(rec, env, [k])[k]
    prefix_replay_s = time.perf_counter() - t0
    reps = max(5, n // 4)

    def restore_only():
        restore(host._initial, host.components)
        host.state_env.set_state(at.env_state)

    restore_s, start_s, scratch_s = [], [], []
    for _ in range(reps):  # interleaved, so drift on a shared machine hits each alike
        t0 = time.perf_counter()
        restore_only()
        restore_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        host.start(0, 1, at)
        start_s.append(time.perf_counter() - t0)
        host.finish("bench")
    for _ in range(3):
        t0 = time.perf_counter()
        _prefix_from_scratch(host, rec, k)
        scratch_s.append(time.perf_counter() - t0)
    branches = max(4, n // 10)
    res = run_branches(host, rec, k, branches, control=True, at=at)
    per_branch = []
    for b in range(1, branches + 1):  # timed one by one: restore + continuation
        from rollcap.rollout.offline.branch import branch_resume

        seed, resume = branch_resume(at, rec, b)
        t0 = time.perf_counter()
        end = host.run_episode(b, seed, resume)
        per_branch.append((time.perf_counter() - t0, end.num_steps))
    cont = float(np.median([t for t, _ in per_branch]))
    scratch = float(np.median(scratch_s))
    out = {
        "parent_chunks": rec.num_chunks,
        "chunk": k,
        "step": at.step,
        "branches": branches,
        "control_exact": res.control_diff is None,
        "prefix_replay_once_ms": prefix_replay_s * 1e3,
        "restore_ms": {
            "median": float(np.median(restore_s) * 1e3),
            "p99": float(np.percentile(restore_s, 99) * 1e3),
            "n": reps,
        },
        "start_at_ms": {
            "median": float(np.median(start_s) * 1e3),
            "p99": float(np.percentile(start_s, 99) * 1e3),
            "n": reps,
        },
        "prefix_from_scratch_s": {"median": scratch, "min": float(min(scratch_s)), "max": float(max(scratch_s))},
        "branch_s_median": cont,
        "branch_steps_median": float(np.median([s for _, s in per_branch])),
        "from_scratch_over_branch": (scratch + cont) / cont,
    }
    try:
        import ray  # noqa: F401
    except ImportError:
        out["ray"] = "skipped: ray is not installed (pip install 'rollcap[ray]')"
    else:
        if quick:
            out["ray"] = "skipped with --quick (Ray and two actor pools take 10-60 s to start)"
        else:
            rb = max(8, n // 6)
            out["ray"] = {
                "branches": rb,
                "one": _ray_branches(parts, host, rec, k, at, rb, 1),
                "two": _ray_branches(parts, host, rec, k, at, rb, 2),
            }
            out["ray"]["two_over_one"] = out["ray"]["two"]["branches_per_s"] / out["ray"]["one"]["branches_per_s"]
    host.close()
    return out


def format_branch(b: dict, row) -> None:
    """Rows of the human table (``row(name, value)``)."""
    row(
        "parent / boundary",
        f"{b['parent_chunks']} chunks, branched at chunk {b['chunk']} (step {b['step']}); control {'exact' if b['control_exact'] else 'DIVERGED'}",
    )
    row("put the boundary back once (actions re-applied)", f"{b['prefix_replay_once_ms']:.1f} ms")
    row(
        "restore: env state + capsule (median / p99)",
        f"{b['restore_ms']['median']:.3f} / {b['restore_ms']['p99']:.3f} ms",
    )
    row("start(at=boundary) (median / p99)", f"{b['start_at_ms']['median']:.3f} / {b['start_at_ms']['p99']:.3f} ms")
    row("prefix 0..K re-run from scratch (median)", f"{b['prefix_from_scratch_s']['median'] * 1e3:.0f} ms")
    row(
        "one branch: restore + continuation (median)",
        f"{b['branch_s_median'] * 1e3:.0f} ms ({b['branch_steps_median']:.0f} steps)",
    )
    row("from scratch / branch", f"{b['from_scratch_over_branch']:.2f}x")
    ray = b.get("ray")
    if isinstance(ray, str):
        row("Ray", ray)
    elif ray:
        row(
            f"{ray['branches']} branches on 1 / 2 Ray actors",
            f"{ray['one']['branches_per_s']:.2f} / {ray['two']['branches_per_s']:.2f} branches/s ({ray['two_over_one']:.2f}x)",
        )
