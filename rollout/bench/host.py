"""Bench section ``host``: host overhead per chunk, recording overhead (background and synchronous), capsule reset vs env.reset + runner rebuild, episode start."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from rollcap.rollout.bench.timing import stats, time_calls
from rollcap.rollout.build import Parts, make_env, make_runners


def bench_host(parts: Parts, n: int) -> dict:
    from rollcap.capsule.verbs import restore
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.subscribers import InBackground, Metrics

    episodes = max(2, n // 20)
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts, env)  # checked against the env's observations (--env with a policy that cannot read it is refused)
    out: dict = {"episodes": episodes}

    walls: dict[str, list[float]] = {}
    metrics = Metrics()
    env_meta = {"env_name": parts.env_id, "type": 2, "env_kwargs": dict(parts.env_kwargs or {})}
    with tempfile.TemporaryDirectory() as tmp:
        # interleave plain / synchronous / background-recorded runs of the same episodes
        for rep in range(2):
            for mode in ("plain", "recorded_sync", "recorded_background"):
                rec = EpisodeRecorder(Path(tmp) / f"{mode}{rep}", formats=("npz", "h5"), env_meta=env_meta)
                subs = {"plain": [metrics], "recorded_sync": [rec], "recorded_background": [InBackground(rec)]}[mode]
                host = RolloutHost(env, policy, critic, HostConfig(seed=7), subs, records=mode != "plain")
                t0 = time.perf_counter()
                host.run(episodes)  # on_run_end drains the background writer
                walls.setdefault(mode, []).append(time.perf_counter() - t0)
                rec.close()
    plain = min(walls["plain"])
    out["rollout_wall_s"] = plain
    for mode in ("recorded_sync", "recorded_background"):
        out[f"{mode}_wall_s"] = min(walls[mode])
        out[f"{mode}_overhead"] = (min(walls[mode]) - plain) / plain
    out["recording_overhead"] = out["recorded_background_overhead"]
    over = [b - max(p, c) for b, p, c in zip(metrics.boundary_s, metrics.policy_s, metrics.critic_s)]
    out["boundary_ms_median"] = float(np.median(metrics.boundary_s) * 1e3)
    out["host_overhead_ms_median"] = float(np.median(over) * 1e3)
    out["host_overhead_fraction"] = float(np.median(np.asarray(over) / np.asarray(metrics.boundary_s)))

    host = RolloutHost(env, policy, critic, HostConfig(seed=7))
    host.run_episode(0)
    cap = host._initial

    def capsule_reset():
        restore(cap, host.components)
        host.state_env.set_state(init_state)

    env.reset(seed=1)
    init_state = host.state_env.get_state()

    def rebuild_reset():
        env.reset(seed=1)
        p, c = make_runners(parts, env)
        for part in (p, c):
            if part is not None:  # --critic none
                part.close()

    t_caps = time_calls(capsule_reset, n)
    t_rebuild = time_calls(rebuild_reset, max(2, n // 20), warm=0)
    # The same reset as a real episode pays it: host.start() (restore, env.reset from the
    # episode seed, initial state, subscribers) right after an episode ran its chunks.
    starts = []
    for i in range(max(4, episodes)):
        if i % 2:  # every other start follows a whole episode (caches as a real reset finds them)
            host.run_episode(i)
        t0 = time.perf_counter()
        host.start(100 + i)
        starts.append(time.perf_counter() - t0)
        host.finish("bench")
    out["episode_start_ms"] = float(np.median(starts) * 1e3)
    out["capsule_reset_ms"] = stats(t_caps)["median_ms"]
    out["env_reset_plus_rebuild_ms"] = stats(t_rebuild)["median_ms"]
    out["capsule_reset_speedup"] = out["env_reset_plus_rebuild_ms"] / out["capsule_reset_ms"]
    for part in (policy, critic, env):
        if part is not None:
            part.close()
    return out


def format_host(h: dict, row) -> None:
    """The section's rows of the human table."""
    row("chunk boundary (median)", f"{h['boundary_ms_median']:.2f} ms")
    row("host overhead per chunk (median)", f"{h['host_overhead_ms_median']:.3f} ms ({h['host_overhead_fraction']:.1%} of boundary)")
    row("recording overhead, background writer", f"{h['recorded_background_overhead']:.1%} of rollout wall (npz + h5)")
    row("recording overhead, synchronous writes", f"{h['recorded_sync_overhead']:.1%} of rollout wall")
    row("capsule reset / env.reset + runner rebuild", f"{h['capsule_reset_ms']:.3f} / {h['env_reset_plus_rebuild_ms']:.1f} ms ({h['capsule_reset_speedup']:.0f}x)")
    row("episode start in a rollout (restore + env.reset + initial state)", f"{h['episode_start_ms']:.3f} ms")
