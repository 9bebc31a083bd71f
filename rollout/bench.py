"""``rollcap bench``: side-by-side figures from one run (ratios, not absolutes).

Sections: ``models`` (policy eager vs captured, critic, policy || critic vs
serial, capture time, exactness), ``capsule`` (snapshot/restore per tier vs a
plain copy, restore vs rebuild-and-recapture), ``env`` (steps/s), ``host``
(overhead per chunk, recording overhead, capsule reset vs env.reset + runner
re-creation), ``branch`` (:mod:`rollcap.rollout.bench_branch`), ``scaling``
(capsule restore/snapshot vs copy from 25 KB to 256 MB,
:mod:`rollcap.capsule.bench_scaling`), ``peer`` (the loop users write today,
:mod:`rollcap.rollout.bench_peer`), ``recording`` (the writer's stages,
:mod:`rollcap.rollout.bench_recording`). Each section's seconds are in
``section_s``. Opt-in (``--only``): ``backends`` (the CPU plans jit, aoti and
compile side by side, :mod:`rollcap.rollout.bench_backends`).
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rollcap.kernels.graph import capture_count
from rollcap.kernels.lanes import CpuLane, make_lane
from rollcap.rollout.build import Parts, make_env, make_runners

SECTIONS = ("models", "capsule", "env", "host", "gym", "branch", "scaling", "peer", "recording")
OPT_IN = ("backends",)
"""Sections run only when named in ``--only`` (``backends`` compiles for minutes on a cold cache)."""


def _stats(xs: list[float]) -> dict:
    a = np.asarray(xs) * 1e3
    return {"median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)), "n": len(xs)}


def _time(fn, n: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _sample_obs(parts: Parts):
    env = make_env(parts.env_id, parts.env_kwargs)
    obs, _ = env.reset(seed=0)
    env.close()
    return obs


def bench_models(parts: Parts, n: int) -> dict:
    policy, critic = make_runners(parts)
    obs = _sample_obs(parts)
    noise = np.random.default_rng(0).standard_normal(policy.noise_shape[1:]).astype(np.float32)
    eager_lane = make_lane("eager", parts.device, parts.threads)
    out: dict = {"capture_s": {"policy": policy.graph.capture_seconds, "critic": critic.graph.capture_seconds}}
    out["policy_captured"] = _stats(_time(lambda: policy.act(obs, noise), n))
    out["policy_eager"] = _stats(_time(lambda: eager_lane.run(policy.act_eager, obs, noise), n))
    out["critic_captured"] = _stats(_time(lambda: critic.value(obs), n))
    out["critic_eager"] = _stats(_time(lambda: eager_lane.run(critic.value_eager, obs), n))

    def serial():
        policy.act(obs, noise)
        critic.value(obs)

    def parallel():
        policy.submit(obs, noise)
        critic.submit(obs)
        policy.result()
        critic.result()

    # interleave so drift on a shared machine hits both alike
    ser, par = [], []
    for _ in range(max(1, n // 10)):
        ser += _time(serial, 10, warm=1)
        par += _time(parallel, 10, warm=1)
    out["serial"] = _stats(ser)
    out["parallel"] = _stats(par)
    p_med, c_med = out["policy_captured"]["median_ms"], out["critic_captured"]["median_ms"]
    out["speedup_captured_vs_eager"] = out["policy_eager"]["median_ms"] / p_med
    out["parallel_over_max"] = out["parallel"]["median_ms"] / max(p_med, c_med)
    out["parallel_over_serial"] = out["parallel"]["median_ms"] / out["serial"]["median_ms"]
    a, b = policy.act(obs, noise), policy.act_eager(obs, noise)
    out["policy_bit_identical"] = bool(a.tobytes() == b.tobytes())
    out["policy_max_abs_diff"] = float(np.abs(a - b).max())
    out["critic_bit_identical"] = critic.value(obs) == critic.value_eager(obs)
    out["backend"] = policy.backend
    eager_lane.close()
    policy.close()
    critic.close()
    return out


def bench_capsule(parts: Parts, n: int) -> dict:
    from rollcap.capsule.bench import bench_capsules
    from rollcap.capsule.verbs import restore, snapshot

    policy, critic = make_runners(parts)
    comps = {"policy": policy, "critic": critic}
    out = bench_capsules(comps, repeats=n)
    cap = snapshot(comps, label="bench")
    t_restore = _time(lambda: restore(cap, comps), n)
    before = capture_count()

    def rebuild():
        p, c = make_runners(parts)
        p.close()
        c.close()

    t_rebuild = _time(rebuild, max(2, n // 20), warm=0)
    out["restore_device_ms"] = _stats(t_restore)["median_ms"]
    out["rebuild_and_recapture_ms"] = _stats(t_rebuild)["median_ms"]
    out["restore_vs_rebuild_speedup"] = out["rebuild_and_recapture_ms"] / out["restore_device_ms"]
    out["recaptures_during_rebuild"] = capture_count() - before
    return out


def bench_env(parts: Parts, n: int) -> dict:
    from rollcap.envs.bench import bench_env as _bench

    lane = CpuLane("env-bench", threads=1)  # one core, as the issue asks
    try:
        return lane.run(_bench, max(200, n * 10))
    finally:
        lane.close()


def bench_host(parts: Parts, n: int) -> dict:
    from rollcap.capsule.verbs import restore
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.subscribers import InBackground, Metrics

    episodes = max(2, n // 20)
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts)
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
        p, c = make_runners(parts)
        p.close()
        c.close()

    t_caps = _time(capsule_reset, n)
    t_rebuild = _time(rebuild_reset, max(2, n // 20), warm=0)
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
    out["capsule_reset_ms"] = _stats(t_caps)["median_ms"]
    out["env_reset_plus_rebuild_ms"] = _stats(t_rebuild)["median_ms"]
    out["capsule_reset_speedup"] = out["env_reset_plus_rebuild_ms"] / out["capsule_reset_ms"]
    policy.close()
    critic.close()
    env.close()
    return out


def run_bench(parts: Parts, quick: bool = False, only: tuple[str, ...] | None = None) -> dict:
    """Run the chosen sections (default: all) and return a JSON-able report."""
    only = only or SECTIONS
    bad = [s for s in only if s not in SECTIONS + OPT_IN]
    if bad:
        raise ValueError(f"--only: unknown section(s) {bad}; choose from {','.join(SECTIONS + OPT_IN)}")
    n = 20 if quick else 200
    report: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "device": parts.device, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads_per_lane": parts.threads},
        "repeats": n,
    }
    from rollcap.rollout.bench_gym import bench_gym

    from rollcap.rollout.bench_branch import bench_branch

    fns = {"models": bench_models, "capsule": bench_capsule, "env": bench_env, "host": bench_host, "gym": bench_gym, "branch": bench_branch}
    from rollcap.rollout.bench_peer import bench_peer
    from rollcap.rollout.bench_recording import bench_recording

    from rollcap.rollout.bench_backends import bench_backends

    fns.update({"scaling": bench_scaling, "peer": bench_peer, "recording": bench_recording, "backends": bench_backends})
    report["section_s"] = {}
    for s in only:
        t0 = time.perf_counter()
        report[s] = fns[s](parts, n)
        report["section_s"][s] = time.perf_counter() - t0
    return report


def bench_scaling(parts: Parts, n: int) -> dict:
    """Capsule restore / snapshot vs a plain copy: the shipped runners' capsule, then VLA-shaped ones up to 256 MB (4 MB with --quick)."""
    from rollcap.capsule.bench_scaling import DEFAULT_SIZES, MB, bench_scaling as _scaling

    policy, critic = make_runners(parts)
    try:
        quick = n < 100
        return _scaling({"policy": policy, "critic": critic}, [s for s in DEFAULT_SIZES if s <= 4 * MB] if quick else DEFAULT_SIZES, quick=quick)
    finally:
        policy.close()
        critic.close()


def format_report(r: dict) -> str:
    """The human table."""
    lines = [f"machine: {r['machine']['platform']}, {r['machine']['cpus']} cpus, torch {r['machine']['torch']}, {r['machine']['device']} ({r['machine']['cpu_capability']}), {r['machine']['threads_per_lane']} thread(s)/lane"]

    def row(name, val):
        lines.append(f"  {name:<44} {val}")

    if "models" in r:
        m = r["models"]
        lines.append(f"models (backend {m['backend']}):")
        row("policy chunk eager (median / p99)", f"{m['policy_eager']['median_ms']:.2f} / {m['policy_eager']['p99_ms']:.2f} ms")
        row("policy chunk captured (median / p99)", f"{m['policy_captured']['median_ms']:.2f} / {m['policy_captured']['p99_ms']:.2f} ms")
        row("captured speedup", f"{m['speedup_captured_vs_eager']:.2f}x")
        row("critic eager / captured (median)", f"{m['critic_eager']['median_ms']:.2f} / {m['critic_captured']['median_ms']:.2f} ms")
        row("policy then critic (serial, median)", f"{m['serial']['median_ms']:.2f} ms")
        row("policy || critic on two lanes (median)", f"{m['parallel']['median_ms']:.2f} ms")
        row("parallel / max(policy, critic)", f"{m['parallel_over_max']:.3f}")
        row("capture time policy / critic", f"{m['capture_s']['policy']:.2f} / {m['capture_s']['critic']:.2f} s")
        row("policy captured == eager", "bit-identical" if m["policy_bit_identical"] else f"max|diff| {m['policy_max_abs_diff']:.3g}")
        row("critic captured == eager", "bit-identical" if m["critic_bit_identical"] else "differs")
    if "capsule" in r:
        c = r["capsule"]
        lines.append(f"capsule (policy + critic state, {c['bytes']} bytes):")
        row("plain copy of the same bytes (floor)", f"{c['floor_copy_s'] * 1e3:.4f} ms")
        for tier, t in c["tiers"].items():
            row(f"{tier}: snapshot / restore", f"{t['snapshot_s'] * 1e3:.4f} / {t['restore_s'] * 1e3:.4f} ms (restore {t['restore_over_floor']:.1f}x floor)")
        row("restore vs rebuild-and-recapture", f"{c['restore_device_ms']:.4f} vs {c['rebuild_and_recapture_ms']:.1f} ms ({c['restore_vs_rebuild_speedup']:.0f}x)")
    if "env" in r:
        lines.append("env:")
        for k, v in r["env"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                row(k, f"{v:.4g}")
    if "host" in r:
        h = r["host"]
        lines.append("host:")
        row("chunk boundary (median)", f"{h['boundary_ms_median']:.2f} ms")
        row("host overhead per chunk (median)", f"{h['host_overhead_ms_median']:.3f} ms ({h['host_overhead_fraction']:.1%} of boundary)")
        row("recording overhead, background writer", f"{h['recorded_background_overhead']:.1%} of rollout wall (npz + h5, images)")
        row("recording overhead, synchronous writes", f"{h['recorded_sync_overhead']:.1%} of rollout wall")
        row("capsule reset / env.reset + runner rebuild", f"{h['capsule_reset_ms']:.3f} / {h['env_reset_plus_rebuild_ms']:.1f} ms ({h['capsule_reset_speedup']:.0f}x)")
        row("episode start in a rollout (restore + env.reset + initial state)", f"{h['episode_start_ms']:.3f} ms")
    if "gym" in r:
        from rollcap.rollout.bench_gym import format_gym

        lines.append("gym (ChunkEnv / NoiseSteeringEnv):")
        format_gym(r["gym"], row)
    if "scaling" in r:
        from rollcap.capsule.bench_scaling import format_scaling

        lines.append("capsule scaling (restore / snapshot vs a plain copy; ratio median, IQR over rounds):")
        lines += [f"  {x}" for x in format_scaling(r["scaling"])]
    if "peer" in r:
        from rollcap.rollout.bench_peer import format_peer

        lines.append("peer (the same env and policy driven as LeRobot / openpi loops do):")
        format_peer(r["peer"], row)
    if "recording" in r:
        from rollcap.rollout.bench_recording import format_recording

        lines.append("recording (the writer's stages per episode, real episodes of the shipped task):")
        format_recording(r["recording"], row)
    if "backends" in r:
        from rollcap.rollout.bench_backends import format_backends

        lines.append("CPU plans side by side (jit, aoti, compile; interleaved rounds):")
        format_backends(r["backends"], row)
    if "section_s" in r:
        lines.append("seconds per section: " + ", ".join(f"{k} {v:.1f}" for k, v in r["section_s"].items()))
    if "branch" in r:
        from rollcap.rollout.bench_branch import format_branch

        lines.append("branch (restore + continuation vs the prefix from scratch):")
        format_branch(r["branch"], row)
    return "\n".join(lines)
