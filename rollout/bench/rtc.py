"""Real-time chunking benchmarks (issue 15): stall, success and seam jerk (``python3 -m rollcap.rollout.bench.rtc``).

Sections (``--only``):

- ``graph``: the guided captured graph's latency against the plain one's
  (and the prefix checkpoint's hard-inpainting graph's, if it exists),
  interleaved on the same observation.
- ``stall``: a simulated control clock with a period shorter than one chunk's
  inference; per chunk boundary, the seconds the env's steps came late
  (:class:`~rollcap.rollout.rtc.ControlClock`), synchronous vs RTC at each
  delay. An episode's first chunk is excluded in both (nothing has run yet,
  so the clock starts after it).
- ``success``: success rate over held-out episode seeds (run seed 2, the seeds
  of BENCHMARKS.md's other evaluations) with a 95% Wilson interval:
  synchronous once (in simulation the world waits for a synchronous chunk, so
  its episodes are the same at every delay), naive asynchronous and RTC at
  each delay; with each, the paired difference to synchronous and its 95%
  interval, and the action jerk at chunk seams (mean ``|a[t+1] - 2 a[t] +
  a[t-1]|`` over the steps ``t`` where the executed action's source chunk
  changes, beside the same over all other steps). Modes ``naive-prefix`` /
  ``rtc-prefix`` run the trained hard-prefix checkpoint
  (``--prefix-policy``); its synchronous episodes (``sync-prefix``) run
  then too, and those rows add the paired difference to them.

``--env`` picks the task (default the built-in one; ``MT10`` runs every
MetaWorld MT10 task, each on the same episode seeds, and the success rows
pool them, with a per-task breakdown), ``--policy`` / ``--prefix-policy`` /
``--critic`` the checkpoints (default: the env's shipped ones, the MT10
policy, its hard-prefix checkpoint and critic on an MT10 task).

Everything prints as it goes and lands in ``--out`` as JSON. The machine is
shared: say so next to any figure taken from it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from rollcap.policies import load_policy
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners, policy_runner
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import Subscriber
from rollcap.rollout.learn.train_prefix import PREFIX_CHECKPOINT
from rollcap.rollout.stats import wilson

HELD_OUT_SEED = 2


def paired_diff(a: np.ndarray, b: np.ndarray, z: float = 1.96) -> tuple[float, float, float]:
    """Mean of ``a - b`` (0/1 outcomes on the same seeds) and its 95% normal interval."""
    d = np.asarray(a, float) - np.asarray(b, float)
    m = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return m, m - z * se, m + z * se


def seam_jerk(actions: np.ndarray, seams: list[int]) -> tuple[list[float], list[float]]:
    """``|a[t+1] - 2 a[t] + a[t-1]|`` at the seam steps and at every other interior step."""
    at, other = [], []
    seam_set = set(seams)
    for t in range(1, len(actions) - 1):
        j = float(np.linalg.norm(actions[t + 1] - 2 * actions[t] + actions[t - 1]))
        (at if t in seam_set else other).append(j)
    return at, other


def seams_of(rec, delay: int) -> list[int]:
    """Steps whose action comes from another chunk than the step before (chunk k's own actions start at k*s + d)."""
    starts = rec.chunks["chunk_start"][1:]
    return [int(t) + delay for t in starts if 0 < int(t) + delay < rec.num_steps]


def _config(mode: str, delay: int, seed: int, **kw) -> HostConfig:
    kw = {k: v for k, v in kw.items() if v is not None}
    mode = mode.removesuffix("-prefix")  # the prefix checkpoint: its runner picks the sampler
    if mode == "sync":
        return HostConfig(seed=seed, **kw)
    if mode in ("rtc-soft", "rtc-pigdm"):  # the RTC paper's soft mask (and its guidance, on the eager runner)
        return HostConfig(seed=seed, chunking="rtc", rtc_mask="soft", inference_delay=delay, **kw)
    return HostConfig(seed=seed, chunking=mode, inference_delay=delay, **kw)


MT10 = "MT10"
"""``--env MT10``: every MetaWorld MT10 task."""


def env_specs(env: str | None, env_kwargs: dict | None = None) -> list[tuple[str, dict]]:
    """``--env``'s ``(env id, kwargs)`` list: one env, or the ten MT10 tasks for ``MT10`` (default: the built-in task)."""
    from rollcap.rollout.spec import DEFAULT_ENV

    if env == MT10:
        from rollcap.envs.metaworld import ID_PREFIX, MT10 as TASKS

        return [(ID_PREFIX + t, dict(env_kwargs or {})) for t in TASKS]
    return [(env or DEFAULT_ENV, dict(env_kwargs or {}))]


def _parts(env_id: str, policy: Path | None = None, critic=None) -> Parts:
    """The env's shipped models (:func:`~rollcap.rollout.spec.shipped_models`) unless ``policy`` / ``critic`` name others."""
    return Parts(
        env_id=env_id,
        **({"policy": policy} if policy is not None else {}),
        **({"critic": critic} if critic is not None else {}),
    )


def shipped_prefix(env_id: str) -> Path | None:
    """The shipped hard-prefix checkpoint of the env's shipped policy (PushBlock's or MT10's), None if it has none."""
    from rollcap.rollout.learn.mt10_prefix import PREFIX as MT10_PREFIX

    return {Parts().policy: PREFIX_CHECKPOINT, Parts(env_id=env_specs(MT10)[0][0]).policy: MT10_PREFIX}.get(
        _parts(env_id).policy
    )


def _outcomes(host: RolloutHost, episodes: int, d: int) -> tuple[list[bool], list[float], list[float]]:
    """Success of episodes ``0 .. episodes-1`` of the host's run seed, and the jerk at and away from chunk seams."""
    ok, seam, other = [], [], []
    for i in range(episodes):
        rec = host.run_episode(i).record
        ok.append(bool(rec.success))
        s, o = seam_jerk(rec.steps["actions"], seams_of(rec, d))
        seam += s
        other += o
    return ok, seam, other


def success_section(episodes: int, delays: list[int], modes: list[str], out: dict, seed: int = HELD_OUT_SEED, execute_steps: int | None = None,
                    prefix_policy: Path = PREFIX_CHECKPOINT, policy_path: Path | None = None, envs: list[tuple[str, dict]] | None = None) -> None:  # fmt: skip
    envs = envs or env_specs(None)
    parts = _parts(envs[0][0], policy_path, "none")  # no critic threshold: it cannot change an outcome
    policy, _ = make_runners(parts, rtc=True)
    pigdm = prefixed = None
    made = [(env_id, make_env(env_id, kw)) for env_id, kw in envs]
    rows = out.setdefault("success", {})
    ref = ref_prefix = None
    try:
        runs = (
            [("sync", 0)]
            + [("sync-prefix", 0)] * any(m.endswith("-prefix") for m in modes)
            + [(m, d) for d in delays for m in modes if m != "sync-prefix"]
        )
        for mode, d in runs:
            if d == 0 and mode in (
                "naive",
                "rtc",
                "naive-prefix",
                "rtc-prefix",
            ):  # nothing carried is guided or queued: the sync episodes (tested bit-identical)
                print(f"success {mode:>5} d=0: the synchronous episodes by construction (not run again)", flush=True)
                continue
            if mode == "rtc-pigdm" and pigdm is None:
                pigdm = policy_runner(load_policy(parts.policy), rtc=True, backend="eager", sampler="pigdm")
            if mode.endswith("-prefix") and prefixed is None:  # the trained hard-prefix checkpoint, on its own lane
                prefixed, _ = make_runners(Parts(policy=prefix_policy, critic="none"), rtc=True)
            runner = pigdm if mode == "rtc-pigdm" else prefixed if mode.endswith("-prefix") else policy
            t0 = time.perf_counter()
            ok, seam, other, per_env = [], [], [], {}
            for env_id, env in made:
                got = _outcomes(
                    RolloutHost(env, runner, None, _config(mode, d, seed, execute_steps=execute_steps)),
                    episodes,
                    d if mode != "sync" else 0,
                )
                ok += got[0]
                seam += got[1]
                other += got[2]
                per_env[env_id] = int(sum(got[0]))
            ok_a = np.array(ok)
            ref = ok_a if mode == "sync" else ref
            ref_prefix = ok_a if mode == "sync-prefix" else ref_prefix
            _, lo, hi = wilson(int(ok_a.sum()), len(ok_a))
            row = {
                "mode": mode, "delay": d, "episodes": len(ok_a), "success": float(ok_a.mean()), "ci95": [lo, hi],
                "jerk_seam": float(np.mean(seam)), "jerk_other": float(np.mean(other)), "seams": len(seam),
                "outcomes": ok_a.astype(int).tolist(), "wall_s": time.perf_counter() - t0,
            }  # fmt: skip
            if len(made) > 1:
                row["per_env_successes"] = (
                    per_env  # of ``episodes`` each; ``outcomes`` holds the envs one after another
                )
            if mode != "sync":
                row["minus_sync"] = list(paired_diff(ok_a, ref))
            if mode.endswith("-prefix") and mode != "sync-prefix":
                row["minus_sync_prefix"] = list(paired_diff(ok_a, ref_prefix))
            rows[f"{mode}/d{d}"] = row
            diff = (
                f"  vs sync {row['minus_sync'][0]:+.1%} [{row['minus_sync'][1]:+.1%}, {row['minus_sync'][2]:+.1%}]"
                if "minus_sync" in row
                else ""
            )
            print(f"success {mode:>5} d={d}: {row['success']:.1%} [{lo:.1%}, {hi:.1%}] of {len(ok_a)}{diff}; "
                  f"jerk at seams {row['jerk_seam']:.3f} (other steps {row['jerk_other']:.3f}); {row['wall_s']:.0f} s", flush=True)  # fmt: skip
    finally:
        for runner in (policy, pigdm, prefixed):
            if runner is not None:
                runner.close()


class _Stall(Subscriber):
    """Per launch window (steps k*s .. k*s+s-1, k >= 1): the summed lateness of its steps."""

    def __init__(self, host_ref: list, s: int):
        self.host_ref, self.s, self.windows = host_ref, s, {}

    def on_step(self, e) -> None:
        k = e.step // self.s
        if k >= 1:
            self.windows[(e.episode, k)] = self.windows.get((e.episode, k), 0.0) + self.host_ref[0].clock.last_late_s


def stall_section(episodes: int, delays: list[int], period_s: float, out: dict, execute_steps: int | None = None, policy_path: Path | None = None,
                  env_spec: tuple[str, dict] | None = None, critic_path: Path | str | None = None) -> None:  # fmt: skip
    """Stall per chunk at ``period_s`` in the first env of ``--env`` (policy and critic on their lanes, as ``rollcap run``)."""
    env_spec = env_spec or env_specs(None)[0]
    policy, critic = make_runners(_parts(env_spec[0], policy_path, critic_path), rtc=True)
    env = make_env(*env_spec)
    rows = out.setdefault("stall", {})
    try:
        for mode, d in [("sync", 0)] + [("rtc", d) for d in delays]:
            ref: list = []
            s = execute_steps or policy.cfg.execute_steps
            sub = _Stall(ref, s)
            host = RolloutHost(
                env, policy, critic, _config(mode, d, 0, control_period_s=period_s, execute_steps=execute_steps), [sub]
            )
            ref.append(host)
            lat = []
            for i in range(episodes):
                rec = host.run_episode(i).record
                lat += rec.chunks["latency_policy_s"][1:].tolist()
            w = np.array(list(sub.windows.values()))
            row = {
                "mode": mode, "delay": d, "period_ms": period_s * 1e3, "chunks": len(w),
                "stall_ms_mean": float(w.mean() * 1e3), "stall_ms_p50": float(np.median(w) * 1e3),
                "stall_ms_p95": float(np.percentile(w, 95) * 1e3), "stalled_chunks": float((w > period_s / 10).mean()),
                "inference_ms_p50": float(np.median(lat) * 1e3), "inference_ms_p95": float(np.percentile(lat, 95) * 1e3),
            }  # fmt: skip
            rows[f"{mode}/d{d}"] = row
            print(f"stall {mode:>4} d={d} at {period_s * 1e3:.1f} ms: per chunk mean {row['stall_ms_mean']:.2f} ms, p50 {row['stall_ms_p50']:.2f}, "
                  f"p95 {row['stall_ms_p95']:.2f}; {row['stalled_chunks']:.0%} of {len(w)} chunks stalled; "
                  f"policy inference p50 {row['inference_ms_p50']:.1f} ms, p95 {row['inference_ms_p95']:.1f}", flush=True)  # fmt: skip
    finally:
        policy.close()
        if critic is not None:
            critic.close()


def graph_section(
    chunks: int,
    out: dict,
    policy_path: Path | None = None,
    prefix_policy: Path | None = PREFIX_CHECKPOINT,
    env_spec: tuple[str, dict] | None = None,
) -> None:
    """Plain vs guided captured graph, interleaved, on one observation (median latency per chunk)."""
    env_spec = env_spec or env_specs(None)[0]
    model = load_policy(_parts(env_spec[0], policy_path).policy)
    plain, rtc = policy_runner(model), policy_runner(model, rtc=True)
    rtc.configure(2, model.cfg.execute_steps, "rtc", "soft")
    pre = (
        policy_runner(load_policy(prefix_policy), rtc=True)
        if prefix_policy is not None and Path(prefix_policy).is_file()
        else None
    )
    if pre is not None:
        pre.configure(2, model.cfg.execute_steps, "rtc", "hard")
    obs, _ = make_env(*env_spec).reset(seed=0)
    noise = np.zeros(plain.chunk_shape, np.float32)
    times: dict = {"plain": [], "rtc": [], "prefix": []}
    try:
        for i in range(chunks + 10):
            for name, runner in (("plain", plain), ("rtc", rtc), ("prefix", pre)):
                if runner is not None:
                    t = time.perf_counter()
                    runner.act(obs, noise)
                    times[name].append(time.perf_counter() - t)
    finally:
        for runner in (plain, rtc, pre):
            if runner is not None:
                runner.close()
    a, b = np.array(times["plain"][10:]), np.array(times["rtc"][10:])
    row = {
        "plain_ms_p50": float(np.median(a) * 1e3),
        "rtc_ms_p50": float(np.median(b) * 1e3),
        "ratio": float(np.median(b) / np.median(a)),
        "chunks": chunks,
    }
    if pre is not None:
        c = np.array(times["prefix"][10:])
        row.update(prefix_ms_p50=float(np.median(c) * 1e3), prefix_ratio=float(np.median(c) / np.median(a)))
    out["graph"] = row
    extra = f"; hard-prefix {row['prefix_ms_p50']:.2f} ms ({row['prefix_ratio']:.2f}x)" if pre is not None else ""
    print(
        f"graph: plain {row['plain_ms_p50']:.2f} ms, guided {row['rtc_ms_p50']:.2f} ms per chunk (medians of {chunks}, interleaved): {row['ratio']:.2f}x{extra}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rollcap.rollout.bench.rtc", description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="graph,stall,success", help="comma list of graph,stall,success")
    ap.add_argument("--episodes", type=int, default=200, help="held-out episodes per success configuration")
    ap.add_argument("--stall-episodes", type=int, default=10, help="episodes per stall configuration")
    ap.add_argument("--delays", default="0,1,2,3", help="comma list of inference delays d (env steps)")
    ap.add_argument(
        "--modes",
        default="naive,rtc",
        help="asynchronous modes compared with sync: naive, rtc (HostConfig's default mask), rtc-soft, rtc-pigdm (the paper's guidance, eager, ~5x slower); "
        "naive-prefix, rtc-prefix: the same through the --prefix-policy checkpoint (hard-prefix RTC), whose synchronous episodes (sync-prefix) then run too",
    )
    ap.add_argument(
        "--prefix-policy",
        type=Path,
        default=None,
        help="the prefix-conditioned checkpoint of the -prefix modes (default, without --policy: the env's shipped one, PushBlock's or MT10's)",
    )
    ap.add_argument(
        "--stall-policy",
        type=Path,
        default=None,
        help="policy checkpoint of the stall section (default: the shipped one; a prefix-conditioned one runs hard-prefix RTC)",
    )
    ap.add_argument(
        "--execute-steps",
        type=int,
        default=None,
        help="execution horizon s of the stall and success runs (default: the policy's)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=HELD_OUT_SEED,
        help="run seed of the success episodes (2: held out; others for pilots)",
    )
    ap.add_argument("--period-ms", type=float, default=5.0, help="control period of the stall section")
    ap.add_argument(
        "--env",
        default=None,
        help="env id (default: the built-in task), or MT10: every MetaWorld MT10 task on the same seeds (stall and graph: the first)",
    )
    ap.add_argument(
        "--env-kwargs",
        type=json.loads,
        default=None,
        help="JSON keyword arguments of the env(s), e.g. '{\"render_images\": false}'",
    )
    ap.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="policy checkpoint of the graph, stall and success runs (default: the env's shipped one)",
    )
    ap.add_argument(
        "--critic",
        default=None,
        help="critic checkpoint of the stall section, or none (default: the env's shipped one)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    envs = env_specs(args.env, args.env_kwargs)
    if args.prefix_policy is None and args.policy is None:
        args.prefix_policy = shipped_prefix(envs[0][0])
    if args.prefix_policy is None and any(m.endswith("-prefix") for m in args.modes.split(",")):
        ap.error("--modes: the -prefix modes need --prefix-policy (a prefix-conditioned checkpoint of --policy)")
    delays = [int(x) for x in args.delays.split(",") if x]
    out: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    only = set(args.only.split(","))
    if "graph" in only:
        graph_section(50, out, args.policy, args.prefix_policy, envs[0])
    if "stall" in only:
        stall_section(
            args.stall_episodes,
            [d for d in delays if d > 0],
            args.period_ms / 1e3,
            out,
            args.execute_steps,
            args.stall_policy or args.policy,
            envs[0],
            args.critic,
        )
    if "success" in only:
        success_section(
            args.episodes,
            delays,
            [m for m in args.modes.split(",") if m],
            out,
            args.seed,
            args.execute_steps,
            args.prefix_policy,
            args.policy,
            envs,
        )
    if args.out is not None:
        from rollcap.kernels.files import atomic_write

        atomic_write(args.out, lambda tmp: Path(tmp).write_text(json.dumps(out, indent=1)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
