"""``rollcap bench --actors N`` (section ``ray``): Ray batch rollouts against the alternatives on this machine.

Also ``python3 -m rollcap.rollout.bench.ray``. With N actors (default 2):

- episodes/s of ``rollcap.run`` with 1 and N Ray actors (each actor records
  its own shard, the default; start-up excluded, reported beside), with N
  actors whose episodes the driver records (``shards=False``, the path before
  shards), and in this process without Ray;
- the same with N actors recording nothing (an :class:`ActorPool` whose
  records are dropped on arrival);
- episodes/s of ``AsyncVectorEnv`` with N spawned ``NoiseSteeringEnv``
  workers (the same env, policy and critic; the agent's noise drawn from the
  policy's own N(0, 1); nothing recorded), and of one such env in-process;
- Ray on its own: ``connect()`` time and the memory of a local instance
  (the driver's growth plus every process it started), no actors.

Every run uses the shipped policy and critic. Runs are sequential: on a
shared machine read the figures of one invocation together.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from rollcap.rollout.protocols import Subscriber


def _rss_mb(pids) -> float:
    import psutil

    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def ray_alone() -> dict:
    """Start a local Ray (127.0.0.1, no dashboard), measure time and memory, shut it down."""
    from rollcap.rollout.ray.connect import connect, import_ray

    ray = import_ray()
    import psutil

    me = psutil.Process()
    before = me.memory_info().rss / 2**20
    t0 = time.perf_counter()
    connect(num_cpus=2)
    start_s = time.perf_counter() - t0
    time.sleep(2.0)  # let the prestarted idle workers come up
    children = [p.pid for p in me.children(recursive=True)]
    out = {
        "ray_start_s": start_s,
        "driver_rss_growth_mb": me.memory_info().rss / 2**20 - before,
        "ray_processes": len(children),
        "ray_processes_rss_mb": _rss_mb(children),
    }
    out["ray_total_rss_mb"] = out["driver_rss_growth_mb"] + out["ray_processes_rss_mb"]
    ray.shutdown()
    return out


class _CpuSplit(Subscriber):
    """Cores used by this process, its actors and Ray's other processes between the first and the last episode end."""

    def __init__(self, episodes: int):
        self.episodes, self.seen, self.marks = episodes, 0, []

    def on_episode_end(self, end) -> None:
        self.seen += 1
        if self.seen in (1, self.episodes):
            self.marks.append((time.perf_counter(), _cpu_by_role()))

    def split(self) -> dict:
        (t0, a), (t1, b) = self.marks[0], self.marks[-1]
        return {role: (b.get(role, 0.0) - a.get(role, 0.0)) / (t1 - t0) for role in b}  # cores used, on average


def _cpu_by_role() -> dict:
    import psutil

    me, out = psutil.Process(), {}
    for p in [me, *me.children(recursive=True)]:
        try:
            role = "driver" if p.pid == me.pid else "actors" if "RolloutActor" in " ".join(p.cmdline()) else "ray_other"
            t = p.cpu_times()
            out[role] = out.get(role, 0.0) + t.user + t.system
        except psutil.Error:
            pass
    return out


def run_rate(episodes: int, actors: int, root: Path, shards: bool = True) -> dict:
    """``rollcap.run`` of ``episodes`` shipped-policy episodes on ``actors`` actors (0: in this process), with its CPU split."""
    from rollcap.rollout.api import run

    cpu = _CpuSplit(episodes)
    t0 = time.perf_counter()
    result = run(
        episodes,
        out=root / f"actors{actors}{'' if shards else '-driver'}",
        actors=actors,
        progress=False,
        subscribers=(cpu,),
        **({} if shards else {"shards": False}),
    )
    total = time.perf_counter() - t0
    s = result.summary
    out = {
        "episodes": s["episodes"],
        "chunks": s["chunks"],
        "wall_s": s["wall_s"],
        "total_s": total,
        "episodes_per_s": s["episodes"] / s["wall_s"],
        "chunks_per_s": s["chunks"] / s["wall_s"],
    }
    out["cores_used"] = cpu.split()
    if actors:
        out.update({k: s[k] for k in ("ray_start_s", "actors_start_s", "retries")})
    return out


def vector_rate(workers: int, steps: int) -> dict:
    """Episodes/s and chunks/s of ``NoiseSteeringEnv`` with N(0, 1) noise: AsyncVectorEnv (``workers`` > 1) or one env."""
    import gymnasium as gym

    from rollcap.rollout.gym.envs import make_noise_steering_env

    env = (
        gym.vector.AsyncVectorEnv([make_noise_steering_env] * workers, context="spawn")
        if workers > 1
        else make_noise_steering_env()
    )
    rng = np.random.default_rng(0)
    shape = env.action_space.shape
    try:
        env.reset(seed=list(range(workers)) if workers > 1 else 0)
        env.step(rng.standard_normal(shape).astype(np.float32))  # warm
        episodes, chunks, resetting, t0 = 0, 0, np.zeros(workers, bool), time.perf_counter()
        for _ in range(steps):
            _, _, term, trunc, info = env.step(rng.standard_normal(shape).astype(np.float32))
            done = np.logical_or(term, trunc).reshape(workers)
            episodes += int(np.sum(done))
            chunks += int(np.sum(~resetting))  # a vector env's step after an episode's end only resets that sub-env
            if workers == 1 and done[0]:
                env.reset()
            else:
                resetting = done
        wall = time.perf_counter() - t0
    finally:
        env.close()
    return {
        "episodes": episodes,
        "chunks": chunks,
        "wall_s": wall,
        "episodes_per_s": episodes / wall,
        "chunks_per_s": chunks / wall,
    }


def pool_rate(episodes: int, actors: int) -> dict:
    """Episodes/s of an :class:`ActorPool` of ``actors`` with nothing recorded (records dropped on arrival), start-up excluded."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.ray.actors import ActorPool
    from rollcap.rollout.ray.episodes import episode_specs

    cfg = HostConfig()
    with ActorPool(Parts(), cfg, actors) as pool:
        t0 = time.perf_counter()
        ends = [(e.num_chunks, e.index) for e in pool.run(episode_specs(range(episodes), cfg))]
        wall = time.perf_counter() - t0
    chunks = sum(c for c, _ in ends)
    return {
        "episodes": len(ends),
        "chunks": chunks,
        "wall_s": wall,
        "episodes_per_s": len(ends) / wall,
        "chunks_per_s": chunks / wall,
    }


def rows(actors: int) -> tuple[str, ...]:
    return (
        "actors_1",
        f"actors_{actors}",
        f"actors_{actors}_driver_records",
        "in_process",
        f"pool_{actors}_unrecorded",
        "vector_1",
        f"vector_async_{actors}",
    )


def run_bench(episodes: int = 40, steps: int = 300, rounds: int = 2, actors: int = 2) -> dict:
    """``rounds`` rounds of every row (interleaved, so a busy machine's load falls on all of them alike)."""
    if actors < 2:
        raise ValueError(f"--actors: the Ray section compares 1 actor with N >= 2, got {actors}")
    report: dict = {"actors": actors, "ray_alone": ray_alone(), "rounds": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="rollcap-bench-ray-") as tmp:
            root = Path(tmp)
            r = {f"actors_{n}": run_rate(episodes, n, root) for n in (1, actors)}
            r[f"actors_{actors}_driver_records"] = run_rate(episodes, actors, root, shards=False)
            r["in_process"] = run_rate(episodes, 0, root)
        r[f"pool_{actors}_unrecorded"] = pool_rate(episodes, actors)
        r["vector_1"] = vector_rate(1, steps)
        r[f"vector_async_{actors}"] = vector_rate(actors, steps)
        r["actors_n_over_1"] = r[f"actors_{actors}"]["episodes_per_s"] / r["actors_1"]["episodes_per_s"]
        r["driver_records_n_over_1"] = (
            r[f"actors_{actors}_driver_records"]["episodes_per_s"] / r["actors_1"]["episodes_per_s"]
        )
        r["actors_n_over_async_n_chunks"] = (
            r[f"actors_{actors}"]["chunks_per_s"] / r[f"vector_async_{actors}"]["chunks_per_s"]
        )
        r["unrecorded_over_async_n_chunks"] = (
            r[f"pool_{actors}_unrecorded"]["chunks_per_s"] / r[f"vector_async_{actors}"]["chunks_per_s"]
        )
        report["rounds"].append(r)
    return report


def format_report(report: dict) -> str:
    a, n = report["ray_alone"], report["actors"]
    lines = [
        f"Ray alone: start {a['ray_start_s']:.2f} s, {a['ray_processes']} processes, {a['ray_total_rss_mb']:.0f} MiB RSS ({a['driver_rss_growth_mb']:.0f} driver growth + {a['ray_processes_rss_mb']:.0f})"
    ]
    for i, r in enumerate(report["rounds"], 1):
        lines.append(f"round {i}:")
        for key in rows(n):
            x = r[key]
            extra = (
                f"; start-up {x['actors_start_s']:.1f} s (Ray {x['ray_start_s']:.1f} s), {x['retries']} retries"
                if "actors_start_s" in x
                else ""
            )
            if "cores_used" in x:
                extra += "; cores used: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(x["cores_used"].items()))
            lines.append(
                f"  {key:<18} {x['episodes_per_s']:6.2f} episodes/s  {x['chunks_per_s']:7.1f} chunks/s  ({x['episodes']} episodes in {x['wall_s']:.1f} s{extra})"
            )
        lines.append(
            f"  {n} actors / 1 actor: {r['actors_n_over_1']:.2f}x episodes/s sharded, {r['driver_records_n_over_1']:.2f}x when the driver records; in chunks/s vs AsyncVectorEnv({n}): {r['actors_n_over_async_n_chunks']:.2f}x recorded, {r['unrecorded_over_async_n_chunks']:.2f}x unrecorded"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rollcap.rollout.bench.ray", description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=40, help="episodes per rollcap.run (default: 40)")
    ap.add_argument("--steps", type=int, default=300, help="vector-env steps (chunks per worker) (default: 300)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every row (default: 2)")
    ap.add_argument(
        "--actors",
        type=int,
        default=2,
        help="N: compare 1 actor with N, and AsyncVectorEnv with N workers (default: 2)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    report = run_bench(args.episodes, args.steps, args.rounds, args.actors)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
