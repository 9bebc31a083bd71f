"""Bench section ``host``: host overhead per chunk (with the shipped policy, and at GPU speed with a stand-in 2 ms policy and critic), capsule reset vs env.reset + runner rebuild, episode start (recording overhead: the ``recording`` section)."""

from __future__ import annotations

import time

import numpy as np

from rollcap.rollout.bench.timing import load_note, stats, time_calls
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners


def bench_host(parts: Parts, n: int) -> dict:
    """Host overhead per chunk, capsule reset against env.reset + runner rebuild, episode start, and the host at GPU
    speed. What recording costs is the ``recording`` section's (:mod:`rollcap.rollout.bench.recording`: the writer's
    stages and its overhead over interleaved rounds), not measured here a second time from fewer episodes."""
    from rollcap.capsule.verbs import restore
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.subscribers import Metrics

    episodes = max(6, n // 20)  # the host overhead is a median over their chunks: some dozens even with --quick
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(
        parts, env
    )  # checked against the env's observations (--env with a policy that cannot read it is refused)
    out: dict = {"episodes": episodes}
    metrics = Metrics()
    host = RolloutHost(env, policy, critic, HostConfig(seed=7), [metrics], records=False)
    t0 = time.perf_counter()
    host.run(episodes)
    out["rollout_wall_s"] = time.perf_counter() - t0
    over = [b - max(p, c) for b, p, c in zip(metrics.boundary_s, metrics.policy_s, metrics.critic_s)]
    out["chunks"] = len(over)
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
    out["gpu_speed"] = bench_gpu_speed(parts, max(4, n // 10))
    return out


def bench_gpu_speed(parts: Parts, episodes: int, chunk_s: float = 2e-3) -> dict:
    """The host's own time per boundary when a chunk takes ``chunk_s`` (a GPU's 2 ms), on any machine.

    The shipped runners' host-side work (validation, input writes, the output
    copy) with a chunk that is ready ``chunk_s`` after start
    (:class:`~rollcap.rollout.bench.standin.FixedLatency`), in the bench's env,
    records built (as a recorded run does), no writer. Three figures, medians over every chunk:
    ``host_overhead_ms`` (boundary minus the lanes' ``chunk_s``, as the host's own
    latencies say; the issue's figure), ``call_overhead_ms`` (the whole
    :meth:`~rollcap.rollout.host.RolloutHost.boundary` call minus ``chunk_s``:
    noise, events and subscribers too), ``step_overhead_ms`` (per env step,
    :meth:`~rollcap.rollout.host.RolloutHost.execute` minus ``env.step``).
    """
    from rollcap.rollout.bench.standin import FixedLatency
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.subscribers import Metrics

    import dataclasses

    parts = dataclasses.replace(
        parts, device="cpu", backend=None, precision="fp32"
    )  # the host's work; the stand-in is the device
    env = make_env(parts.env_id, parts.env_kwargs)
    runners = make_runners(parts, env)
    policy, critic = (FixedLatency(r, chunk_s) if r is not None else None for r in runners)
    metrics = Metrics()
    host = RolloutHost(env, policy, critic, HostConfig(seed=7), [metrics], records=True)
    env_step, env_s = env.step, [0.0]

    def timed_step(action):  # the bench's own hook: the host calls env.step, this times it
        t0 = time.perf_counter()
        try:
            return env_step(action)
        finally:
            env_s[0] += time.perf_counter() - t0

    env.step = timed_step
    host.run_episode(0)  # warm-up: first-call caches, the initial capsule
    del metrics.boundary_s[:], metrics.policy_s[:], metrics.critic_s[:]
    calls: list[float] = []
    steps: list[float] = []
    for i in range(1, episodes + 1):
        host.start(i)
        while not host.done:
            t0 = time.perf_counter()
            host.boundary()
            calls.append(time.perf_counter() - t0 - chunk_s)
            if not host.done:
                e0, t0 = env_s[0], time.perf_counter()
                done = host.execute()
                if done:
                    steps.append((time.perf_counter() - t0 - (env_s[0] - e0)) / len(done))
        host.finish()
    host.close()
    if not metrics.boundary_s:  # every episode ended before its first chunk: say why rather than average nothing
        raise RuntimeError(
            f"bench host (stand-in): no chunk ran; stop reasons {sorted({e['stop_reason'] for e in metrics.episodes})}"
        )
    over = np.asarray(metrics.boundary_s) - np.maximum(metrics.policy_s, metrics.critic_s)
    ms = lambda xs: float(np.median(xs) * 1e3)  # noqa: E731
    return {
        "chunk_ms": chunk_s * 1e3,
        "episodes": episodes,
        "chunks": len(calls),
        "boundary_ms": ms(metrics.boundary_s),
        "host_overhead_ms": ms(over),
        "host_overhead_p90_ms": float(np.percentile(over, 90) * 1e3),
        "host_overhead_fraction": float(np.median(over / np.asarray(metrics.boundary_s))),
        "call_overhead_ms": ms(calls),
        "step_overhead_ms": ms(steps),
    }


def format_host(h: dict, row) -> None:
    """The section's rows of the human table."""
    row("chunk boundary (median)", f"{h['boundary_ms_median']:.2f} ms ({h['chunks']} chunks{load_note(h.get('load'))})")
    row(
        "host overhead per chunk (median)",
        f"{h['host_overhead_ms_median']:.3f} ms ({h['host_overhead_fraction']:.1%} of boundary)",
    )
    row("recording overhead", "the recording section's (below)")
    row(
        "capsule reset / env.reset + runner rebuild",
        f"{h['capsule_reset_ms']:.3f} / {h['env_reset_plus_rebuild_ms']:.1f} ms ({h['capsule_reset_speedup']:.0f}x)",
    )
    row("episode start in a rollout (restore + env.reset + initial state)", f"{h['episode_start_ms']:.3f} ms")
    g = h.get("gpu_speed")
    if g is not None:
        row(f"at GPU speed (stand-in {g['chunk_ms']:.0f} ms policy and critic, {g['chunks']} chunks):")
        row(
            "  host overhead per boundary (median, p90)",
            f"{g['host_overhead_ms']:.3f} ms, {g['host_overhead_p90_ms']:.3f} ms ({g['host_overhead_fraction']:.1%} of boundary)",
        )
        row("  whole boundary() call minus the chunk", f"{g['call_overhead_ms']:.3f} ms")
        row("  host per env step (execute minus env.step)", f"{g['step_overhead_ms']:.3f} ms")
