"""``rollcap bench --only batch``: many envs on one policy graph, in this process and in env workers, side by side.

For each policy (the shipped checkpoints; on CPU also a stand-in whose replay takes a fixed time, a GPU's batch-32
share, :mod:`~rollcap.rollout.bench.standin_rows`) and each ``envs`` N of the list (``--batch-envs``), one recorded
run of the same episodes (npz + HDF5) in this process (batch 1: the plain host; N > 1: the batched core, the writer
thread) and, for N > 1, in ``--batch-workers`` W env workers (each records its shard), interleaved rounds. Each run
reports episodes/s (first episode's start to the last one written), the policy's busy fraction of wall (its lane's
replay seconds: GPU time on CUDA) and where the time goes: the host's wait for the policy, the rest of a round (env
steps with their per-step host work), between rounds (finishing, handing records to the writer, starting the next
episode); with workers the parent's wait for its workers and its own work, and the workers' own split (host: launch
and decide; env: the chunks' steps; write: their shards).

Then the host's own per-slot work at batch 32 (issue 41 item 3) with a stand-in of fixed latency: a round of the
in-process core minus the replay and the env steps, per slot; and the env workers' parent's work per slot. Then
the batched vector env against ``AsyncVectorEnv(2)`` (issue 34). :func:`predict` is the model for a many-core box.

Only for the built-in task with checkpoint models; another ``--env`` / policy is refused.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from rollcap.rollout.bench.standin_rows import FixedLatencyRows, Timed
from rollcap.rollout.spec import DEFAULT_ENV, Parts, named_policy
from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.protocols import Subscriber

ENVS = {"cpu": (1, 8), "cuda": (1, 32)}
"""The ``envs`` list per device type (``--batch-envs`` overrides it; this 2-core box: 1 and 8)."""
STANDIN_S = 4e-3
"""The stand-in's replay: a GPU's share of a batch-32 round (issue 41)."""


def _runners(parts: Parts, n: int, env, standin: float | None):
    from rollcap.rollout.bench.standin import FixedLatency

    policy, critic = make_runners(parts, env, envs=n)
    if standin:
        wrap = FixedLatency if n == 1 else FixedLatencyRows
        policy, critic = wrap(policy, standin), (None if critic is None else wrap(critic, standin))
    return policy, critic


def _timed_rounds(core) -> list:
    """``core.round`` wrapped to add its seconds and calls up in the returned ``[seconds, rounds]``."""
    rounds_s = [0.0, 0]
    inner = core.round

    def timed_round(*a, **kw):
        t1 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            rounds_s[0] += time.perf_counter() - t1
            rounds_s[1] += 1

    core.round = timed_round
    return rounds_s


def _drive(parts: Parts, n: int, workers: int, standin: float | None, episodes: int, out: Path, seed: int) -> dict:
    """One recorded run of ``episodes`` (see the module docstring); its rate and where the time went."""
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.recording.shards import ManifestWriter
    from rollcap.rollout.subscribers import InBackground

    env = make_env(parts.env_id, parts.env_kwargs)
    meta = {"env_name": parts.env_id, "type": 2, "env_kwargs": dict(parts.env_kwargs or {})}
    cfg = HostConfig(seed=seed)
    policy, critic = _runners(parts, n, env, standin)
    tp, tc = Timed(policy), (None if critic is None else Timed(critic))
    owned, r, count = [env, policy, critic], {}, _Chunks()
    try:
        if workers:
            from rollcap.rollout.workers import EnvWorkers

            core = EnvWorkers(parts.env_id, parts.env_kwargs, policy, critic, cfg, workers)
            owned.insert(0, core)
            writer = ManifestWriter(out, ("npz", "h5"), meta)
            core.record_to(writer, meta, [count])
            t0 = time.perf_counter()
            list(core.episodes(range(episodes)))
            wall = time.perf_counter() - t0
            core.close()  # the workers' own timings come with their goodbye
            writer.close()
            t, wt = core.timing, core.worker_timing
            r = {"rounds": t["rounds"], "policy_wait_s": t["replay_s"], "wait_workers_s": t["wait_workers_s"],
                 "parent_host_s": t["host_s"], "worker_host_s": wt.get("host_s", 0.0), "worker_env_s": wt.get("env_s", 0.0),
                 "worker_write_s": wt.get("write_s", 0.0),
                 **{f"worker_{k}": wt.get(k, 0.0) for k in ("host_cpu_s", "env_cpu_s", "write_cpu_s")}, "parent_commit_s": t["commit_s"], "parent_host_us_per_slot_round": 1e6 * (t["host_s"] - t["commit_s"]) / max(1, t["rounds"] * n)}  # fmt: skip
        else:
            writer = InBackground(EpisodeRecorder(out, formats=("npz", "h5"), env_meta=meta))
            if n == 1:
                from rollcap.rollout.host import RolloutHost

                core = RolloutHost(env, tp, tc, cfg, [writer, count])
                t0 = time.perf_counter()
                core.run(episodes)  # on_run_end drains the writer
                rounds_s = None
            else:
                from rollcap.rollout.batch import BatchedCore

                envs = [env] + [make_env(parts.env_id, parts.env_kwargs) for _ in range(n - 1)]
                owned += envs[1:]
                core = BatchedCore(envs, tp, tc, cfg, [writer, count])
                rounds_s = _timed_rounds(core)
                t0 = time.perf_counter()
                core.run(episodes)
            wall = time.perf_counter() - t0
            busy = tp.busy_s
            r = {"policy_wait_s": tp.waited_s + (tc.waited_s if tc else 0.0)}
            if rounds_s is not None:
                r.update(
                    rounds=rounds_s[1],
                    in_round_other_s=rounds_s[0] - r["policy_wait_s"],
                    between_rounds_s=wall - rounds_s[0],
                )
            else:
                r.update(rounds=tp.replays, other_s=wall - r["policy_wait_s"])
    finally:
        for part in owned:
            if part is not None:
                part.close()
    if workers:
        busy = core.timing["policy_busy_s"]
    return {
        "episodes_per_s": episodes / wall,
        "wall_s": wall,
        "policy_busy_fraction": busy / wall,
        "episodes": episodes,
        "chunks": count.n,
        **r,
    }


class _Chunks(Subscriber):
    def __init__(self):
        self.n = 0

    def on_chunk(self, chunk) -> None:
        self.n += 1


def host_per_slot(parts: Parts, n: int = 32, rounds: int = 30, seconds: float = 2e-3) -> dict:
    """The in-process core's own work per slot and round at batch ``n`` with a stand-in replay of ``seconds`` (no recording,
    envs stepped on the driver's thread), in microseconds: ``launch`` (validate the row), ``replay`` (the host's part of
    the replay: the rows copied in, the graphs launched), ``decide`` (less the replay's wait: the chunk, the predicates,
    the event), ``draw_ahead`` (the next noise, while the batch replays: host time only where it outlasts the replay),
    ``execute`` (env steps with their per-step work)."""
    from rollcap.rollout.batch import BatchedCore
    from rollcap.rollout.config import HostConfig

    parts = dataclasses.replace(
        parts, device="cpu", backend=None, precision="fp32"
    )  # the host's work; the stand-in is the device
    envs = [make_env(parts.env_id, parts.env_kwargs) for _ in range(n)]
    policy, critic = _runners(parts, n, envs[0], seconds)
    tp, tc = Timed(policy), Timed(critic)
    core = BatchedCore(envs, tp, tc, HostConfig(seed=5), records=False, workers=0)
    spent: dict[str, float] = {}

    def timed(name: str, inner):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

        return call

    for h in core.hosts:
        for name in ("launch", "decide", "draw_ahead", "execute"):
            setattr(h, name, timed(name, getattr(h, name)))
    core.replay = timed("replay", core.replay)
    walls = []
    try:
        for i in range(n):
            core.hosts[i].start(i)
        for k in range(rounds + 1):
            for i, h in enumerate(core.hosts):  # keep every slot running: a finished one starts again
                if h.done:
                    h.finish()
                    h.start(n * (k + 1) + i)
            if k == 1:  # the first round warms
                spent.clear()
                tp.__dict__["waited_s"] = tc.__dict__["waited_s"] = 0.0
            t0 = time.perf_counter()
            core.round()
            walls.append(time.perf_counter() - t0)
    finally:
        core.close()
        policy.close()
        critic.close()
    per = {k: 1e6 * v / (rounds * n) for k, v in spent.items()}
    waited = 1e6 * (tp.waited_s + tc.waited_s) / (rounds * n)
    decide = per.get("decide", 0.0) - waited  # the first slot's decide waits for the replay
    ahead = max(0.0, per.get("draw_ahead", 0.0) - 1e6 * seconds / n)
    return {"batch": n, "rounds": rounds, "standin_ms": seconds * 1e3, "round_ms": 1e3 * float(np.median(walls[1:])),
            "launch_us": per.get("launch", 0.0), "replay_us": per.get("replay", 0.0), "decide_us": decide,
            "draw_ahead_us": per.get("draw_ahead", 0.0), "host_us_per_slot_round": per.get("launch", 0.0) + per.get("replay", 0.0) + decide + ahead,
            "env_us_per_slot_round": per.get("execute", 0.0)}  # fmt: skip


H100_POLICY_S = {1: 2.0e-3, 8: 2.9e-3, 32: 4.09e-3, 64: 5.38e-3, 128: 7.79e-3}
"""The shipped policy's replay at each batch on one H100 (CUDA graphs; issue 41's table), for :func:`predict`."""


def predict(
    t_policy_s: float,
    t_slot_s: float,
    envs: int,
    workers: int,
    chunks_per_episode: float,
    t_write_s: float = 0.0,
    cores: int = 0,
) -> float:
    """Episodes/s of ``envs`` envs on ``workers`` env workers: a round is the replay, then the env work, in sequence. The
    env work takes the busiest worker's slots one after another (``t_slot_s`` each: launch, decide, the chunk's env steps),
    or, where the cores are short, all slots' work and the round's share of the records' writes (``t_write_s`` an episode)
    spread over the ``cores`` - 1 cores this process leaves (0: cores enough)."""
    env_s = -(-envs // max(1, workers)) * t_slot_s
    if cores > 1:
        env_s = max(env_s, (envs * t_slot_s + envs / chunks_per_episode * t_write_s) / (cores - 1))
    return envs / ((t_policy_s + env_s) * chunks_per_episode)


def model(runs: dict, here: int, cores: int = 16) -> dict:
    """:func:`predict` checked on this machine's worker runs (their own replay; slot and write CPU times; ``here`` cores), then
    for a ``cores``-core GPU box (``cores - 2`` workers) from the slot and write times measured here and :data:`H100_POLICY_S`."""
    out: dict = {"check": {}, f"predict_{cores}_cores": {}}
    t_slot = []
    for name, rs in runs.items():
        r = rs[-1]
        if "worker_env_s" not in r or not r["rounds"]:
            continue
        n, w = (int(x) for x in name.split("_envs_")[1].split("_workers_"))
        slot = (r["worker_host_cpu_s"] + r["worker_env_cpu_s"]) / (
            r["rounds"] * n
        )  # CPU seconds: what a core of its own takes
        write, chunks = r["worker_write_cpu_s"] / r["episodes"], r["chunks"] / r["episodes"]
        got = predict(r["policy_wait_s"] / r["rounds"], slot, n, w, chunks, write, here)
        out["check"][name] = {
            "t_slot_ms": 1e3 * slot,
            "t_write_ms": 1e3 * write,
            "predicted": got,
            "measured": r["episodes_per_s"],
        }
        if name.startswith("policy_"):
            t_slot.append((slot, chunks, write))
    if t_slot:
        slot, chunks, write = t_slot[-1]
        for n, t_policy in H100_POLICY_S.items():
            out[f"predict_{cores}_cores"][f"envs_{n}"] = predict(
                t_policy, slot, n, min(n, cores - 2), chunks, write, cores
            )
        out["t_slot_ms"], out["chunks_per_episode"], out["t_write_ms"] = 1e3 * slot, chunks, 1e3 * write
    return out


def bench_batch(parts: Parts, n: int, envs=None, workers=None, standin=None) -> dict:
    if parts.env_id != DEFAULT_ENV or parts.env_kwargs or named_policy(parts.policy) is not None:
        from rollcap.rollout.errors import ConfigError

        raise ConfigError(
            "env_kwargs" if parts.env_kwargs else "env_id" if parts.env_id != DEFAULT_ENV else "policy",
            "section batch is measured on the built-in task with checkpoint models; pick other sections with --only",
        )
    import torch

    kind = torch.device(parts.device).type
    quick = n < 100
    envs = tuple(envs or ENVS[kind])
    standin = (STANDIN_S if kind == "cpu" else None) if standin is None else (standin or None)
    cores = os.cpu_count() or 1
    policies = {"policy": None, **({"standin": standin} if standin else {})}
    episodes, rounds = (8, 1) if quick else ((24, 3) if kind == "cpu" else (128, 2))
    configs = {}
    for pol, s in policies.items():
        for e in envs:
            configs[f"{pol}_envs_{e}"] = (e, 0, s)
            if e > 1:
                w = workers or max(1, min(e, cores - (1 if cores > 2 else 0)))
                configs[f"{pol}_envs_{e}_workers_{w}"] = (e, w, s)
    runs: dict[str, list[dict]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="rollcap-bench-batch-") as tmp:
        for k in range(rounds):  # interleaved: every configuration once a round, the same episodes
            for name, (e, w, s) in configs.items():
                runs[name].append(_drive(parts, e, w, s, max(episodes, 2 * e), Path(tmp) / f"r{k}-{name}", seed=k + 1))
    out = {"envs": list(envs), "standin_ms": standin * 1e3 if standin else None, "rounds": rounds, "episodes": episodes,
           "cpus": cores, "load_average": list(os.getloadavg()), "configs": list(configs), "runs": runs}  # fmt: skip
    for name in configs:
        base = f"{name.split('_envs_')[0]}_envs_1"
        if base in runs and name != base:
            out.setdefault("speedup", {})[name] = [
                b["episodes_per_s"] / a["episodes_per_s"] for a, b in zip(runs[base], runs[name])
            ]
    out["model"] = model(runs, cores)
    hps = [host_per_slot(parts, 32 if not quick else 8, 30 if not quick else 5) for _ in range(1 if quick else 3)]
    out["host_per_slot"] = {
        k: [h[k] for h in hps] if k.endswith("_us") or k.endswith("_round") else hps[0][k] for k in hps[0]
    }
    out["load_average_end"] = list(os.getloadavg())
    from rollcap.rollout.bench.gym import _vector_rate as async_rate

    out["async_2_chunks_per_s"] = async_rate(parts, 2, 8 if quick else 40)
    out["vector_chunks_per_s"] = _vector_rate(parts, max(envs), 8 if quick else 40)
    return out


def _vector_rate(parts: Parts, envs: int, chunks: int) -> float:
    """Sub-env chunks/s of the batched NoiseSteeringVectorEnv with ``envs`` sub-envs."""
    from rollcap.rollout.gym.vector import make_noise_steering_vector_env

    env = make_noise_steering_vector_env(envs, parts.env_kwargs, parts.device, threads=parts.threads)
    try:
        env.reset(seed=0)
        noise = np.random.default_rng(0).standard_normal((chunks, envs, *env.chunk_shape)).astype(np.float32)
        env.step(noise[0])  # warm
        t0 = time.perf_counter()
        for a in noise[1:]:
            env.step(a)
        return (chunks - 1) * envs / (time.perf_counter() - t0)
    finally:
        env.close()


def format_batch(b: dict, row) -> None:
    def span(xs, fmt="{:.2f}"):
        xs = sorted(xs)
        return (
            (fmt.format(np.median(xs)) + (f" ({fmt.format(xs[0])}-{fmt.format(xs[-1])})" if len(xs) > 1 else ""))
            if xs
            else "-"
        )

    row(
        f"({b['rounds']} interleaved round(s), >= {b['episodes']} episodes a run, npz + HDF5, {b['cpus']} cpus, load {b['load_average'][0]:.1f})"
    )
    for name in b["configs"]:
        rs = b["runs"][name]
        line = f"{span([r['episodes_per_s'] for r in rs])} ep/s, policy busy {span([100 * r['policy_busy_fraction'] for r in rs], '{:.0f}')}%"
        if name in b.get("speedup", {}):
            line += f", {span(b['speedup'][name])}x envs 1"
        row(name, line)
        r = rs[-1]
        w = r["wall_s"]
        if "wait_workers_s" in r:
            row(
                "  parent: policy / workers / own",
                f"{r['policy_wait_s'] / w:.0%} / {r['wait_workers_s'] / w:.0%} / {r['parent_host_s'] / w:.0%} of wall "
                f"(commits {r['parent_commit_s'] / w:.0%}; {r['parent_host_us_per_slot_round']:.1f} us a slot and round besides)",
            )
            row(
                "  workers (all, per wall): host / env / write",
                f"{r['worker_host_s'] / w:.2f} / {r['worker_env_s'] / w:.2f} / {r['worker_write_s'] / w:.2f}",
            )
        elif "in_round_other_s" in r:
            row(
                "  policy wait / rest of round / between",
                f"{r['policy_wait_s'] / w:.0%} / {r['in_round_other_s'] / w:.0%} / {r['between_rounds_s'] / w:.0%} of wall",
            )
        else:
            row("  policy wait / the rest", f"{r['policy_wait_s'] / w:.0%} / {r['other_s'] / w:.0%} of wall")
    m = b.get("model", {})
    for name, c in m.get("check", {}).items():
        row(
            f"model check, {name}",
            f"predicted {c['predicted']:.2f} ep/s, measured {c['measured']:.2f} (slot {c['t_slot_ms']:.2f} ms, write {c['t_write_ms']:.0f} ms an episode)",
        )
    if m.get("t_slot_ms"):
        p16 = " / ".join(f"{k[5:]}: {v:.0f}" for k, v in m["predict_16_cores"].items())
        row(
            "predicted ep/s, 16 cores + an H100, 14 workers",
            f"{p16} (slot {m['t_slot_ms']:.2f} ms as here, {m['chunks_per_episode']:.1f} chunks/ep)",
        )
    h = b["host_per_slot"]
    us = {k: span(v, "{:.1f}") for k, v in h.items() if isinstance(v, list)}
    row(
        f"host per slot and round, batch {h['batch']}, {h['standin_ms']:.0f} ms stand-in, in process",
        f"{us['host_us_per_slot_round']} us (goal <= 20)",
    )
    row(
        "  launch / replay / decide / noise (beside the replay)",
        f"{us['launch_us']} / {us['replay_us']} / {us['decide_us']} / {us['draw_ahead_us']} us; env steps {us['env_us_per_slot_round']} us",
    )
    if "vector_chunks_per_s" in b:
        row(
            "chunks/s: AsyncVectorEnv(2) / vector env",
            f"{b['async_2_chunks_per_s']:.1f} / {b['vector_chunks_per_s']:.1f}",
        )
