"""``python3 -m rollcap.rollout.bench.ceiling``: how many episodes/s recording can take, the driver's path vs shards.

Producers are Ray actors that do no physics: each hands over a synthetic
episode of the real shape (:func:`~rollcap.rollout.recording.synthetic_record`:
two cameras ``[T, S, S, 3]`` uint8, proprio, actions, chunks) re-indexed, as
fast as it is taken, so the only limit is recording:

- ``driver``: today's path with ``shards=False``: the record travels to the
  driver, which emits it and writes both formats on its one background writer.
- ``sharded``: each producer writes the episode into its own shard (npz and
  HDF5, as :class:`~rollcap.rollout.recording.EpisodeRecorder` always does)
  and returns a receipt and the record without images; the driver appends one
  manifest line.

``sweep``: episodes/s for N = 1, 2, 4, 8 producers (until it flattens) at one
size. ``sizes``: 10, 100, 1,000 steps at 64 and 224 px. ``large``: a simulated
large run, ``actors`` producers that each take ``episode_s`` per episode (the
wall of a real episode on one core), i.e. many actors' worth of load on one
driver; it reports the episodes/s reached against the load offered.

Figures depend on the machine's cores and disk; on a shared machine read one
invocation's figures together.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


def _producer(steps: int, image_size: int, episode_s: float) -> type:
    """An actor class that returns (or records) one template episode per call, after ``episode_s`` of sleep."""
    from rollcap.rollout.ray.episodes import RolloutActor, _node_id
    from rollcap.rollout.recording import synthetic_record

    class Producer(RolloutActor):  # defined here, so Ray ships the class by value
        def __init__(self, parts, config, shipped=()):
            self.template = synthetic_record(steps=steps, image_size=image_size)
            self.policy = self.critic = self.env = None

        def ready(self) -> dict:
            info = {"pid": os.getpid(), "node": _node_id()}
            if hasattr(self, "_sees_run"):
                info["sees_run"] = self._sees_run
            return info

        def run(self, index, seed, config=None):
            if episode_s:
                time.sleep(episode_s)
            return replace(self.template, index=index)

    return Producer


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def rate(path: str, producers: int, steps: int, image_size: int, episodes: int, episode_s: float = 0.0) -> dict:
    """Episodes/s of ``episodes`` episodes through ``path`` ("driver" or "sharded") from ``producers`` producers; the first one each is warm-up."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.ray.actors import ActorPool, ActorResources
    from rollcap.rollout.ray.placement import Shards
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.recording.shards import ManifestWriter
    from rollcap.rollout.subscribers import InBackground

    with tempfile.TemporaryDirectory(prefix="rollcap-ceiling-", dir=os.environ.get("ROLLCAP_BENCH_DIR")) as tmp:
        shards = Shards(ManifestWriter(tmp, env_meta=ENV_META), ENV_META) if path == "sharded" else None
        writer = None if shards else InBackground(EpisodeRecorder(tmp, env_meta=ENV_META))
        cls = _producer(steps, image_size, episode_s)
        with ActorPool(
            Parts(critic=None),
            HostConfig(),
            producers,
            resources=ActorResources(cpus=0.01),
            actor_cls=cls,
            setup=shards and shards.setup,
        ) as pool:
            it = shards.episodes(pool, range(episodes)) if shards else pool.episodes(range(episodes), [writer])
            t0 = c0 = None
            n = 0
            for _ in it:
                n += 1
                if n == producers:  # every producer has delivered once: measure from here
                    t0, c0 = time.perf_counter(), _cpu_s()
            if writer is not None:
                writer.close()  # every episode on disk
            else:
                shards.manifest.close()
            wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        measured = episodes - producers
        return {"path": path, "producers": producers, "steps": steps, "image_size": image_size, "episodes": measured, "wall_s": wall,
                "episodes_per_s": measured / wall, "driver_cores": cpu / wall, "mb_per_episode": _episode_mb(steps, image_size)}  # fmt: skip


def _episode_mb(steps: int, image_size: int) -> float:
    return 2 * steps * image_size * image_size * 3 / 1e6


def _episodes_for(steps: int, image_size: int, producers: int) -> int:
    """Enough episodes for a few seconds, bounded by bytes (a 1,000-step 224 px episode is 300 MB)."""
    return producers + max(3, min(60, int(400 / max(_episode_mb(steps, image_size), 0.1))))


def run_bench(quick: bool = False, large_actors: int = 8, episode_s: float = 0.05) -> dict:
    """The sweep, the size matrix and the simulated large run (``quick``: fewer points)."""
    from rollcap.rollout.ray.connect import connect, import_ray

    ray = import_ray()
    owned = connect(num_cpus=max(os.cpu_count() or 1, 2))
    report: dict = {"cpus": os.cpu_count(), "sweep": [], "sizes": [], "large": []}
    try:
        for n in (1, 2, 4) if quick else (1, 2, 4, 8):
            for path in ("driver", "sharded"):
                report["sweep"].append(rate(path, n, 100, 64, _episodes_for(100, 64, n)))
        sizes = (
            [(10, 64), (100, 224)] if quick else [(10, 64), (100, 64), (1000, 64), (10, 224), (100, 224), (1000, 224)]
        )
        for steps, px in sizes:
            n = 1 if steps * px >= 224_000 else 2
            for path in ("driver", "sharded"):
                report["sizes"].append(
                    rate(path, n, steps, px, _episodes_for(steps, px, n) if steps * px < 224_000 else n + 2)
                )
        for path in ("driver", "sharded"):
            r = rate(path, large_actors, 100, 64, large_actors * (2 if quick else 4), episode_s)
            r["offered_per_s"] = large_actors / episode_s
            report["large"].append(r)
    finally:
        if owned:
            ray.shutdown()
    return report


def format_report(report: dict) -> str:
    lines = [f"recording ceiling on {report['cpus']} core(s); producers do no physics"]

    def row(r: dict) -> str:
        extra = f", offered {r['offered_per_s']:.0f}/s" if "offered_per_s" in r else ""
        return (f"  {r['path']:<8} N={r['producers']:<3} {r['steps']:>5} steps {r['image_size']:>3} px ({r['mb_per_episode']:6.1f} MB): "
                f"{r['episodes_per_s']:7.2f} episodes/s, driver {r['driver_cores']:.2f} cores ({r['episodes']} in {r['wall_s']:.1f} s{extra})")  # fmt: skip

    for name in ("sweep", "sizes", "large"):
        lines.append(f"{name}:")
        lines += [row(r) for r in report[name]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rollcap.rollout.bench.ceiling", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer points")
    ap.add_argument("--large-actors", type=int, default=8, help="producers in the simulated large run (default: 8)")
    ap.add_argument(
        "--episode-s",
        type=float,
        default=0.05,
        help="seconds per episode of each simulated producer (default: 0.05: 8 of them offer the load of about 40 real actors at 4 episodes/s)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    report = run_bench(args.quick, args.large_actors, args.episode_s)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
