"""``rollcap bench --only backends``: the CPU plans side by side (jit, aoti, compile).

Why: ``jit`` (the CPU default) is built on the deprecated ``torch.jit.trace``;
a replacement must be exact within itself, let the policy and critic lanes
overlap, and be at least as fast. For each backend the shipped policy and
critic are captured (capture seconds include compiling, or loading a compiled
library from the cache, see :mod:`rollcap.kernels.compiled`), then timed in
interleaved rounds so drift on a shared machine hits every backend alike:

- policy chunk and critic value latency (each a replay on its lane);
- policy ‖ critic on two lanes vs one after the other, and vs max(policy, critic);
- two policies on two lanes vs one after the other (0.5 = full overlap, 1.0 = none:
  the critic is too short to show a lane that holds the GIL);
- the policy's latency over jit's, per round (median and quartiles);
- GIL: how far a pure-Python loop on the caller's thread gets while the policy
  replays on its lane, against the loop alone (100% = the plan never holds the
  GIL; a plan that holds it starves the host and the other lane);
- exactness: two replays of the same inputs give the same bytes; the largest
  deviation from eager.

Not in the default sections (a cold cache compiles for minutes): ``--only backends``.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time

import numpy as np

from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners

BACKENDS = ("jit", "aoti", "compile")


def _spread(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2]}


def _gil_progress(policy, obs, noise, seconds: float = 0.3, rounds: int = 5) -> float:
    """A Python loop's iterations/s while the policy replays back to back on its lane, over the loop alone (median of alternating rounds)."""

    def spin(s: float) -> float:
        n, end = 0, time.perf_counter() + s
        while time.perf_counter() < end:
            n += 1
        return n / s

    ratios = []
    for _ in range(rounds):
        alone = spin(seconds)
        stop = threading.Event()

        def replays():
            while not stop.is_set():
                policy.act(obs, noise)

        th = threading.Thread(target=replays)
        th.start()
        time.sleep(0.02)
        during = spin(seconds)
        stop.set()
        th.join()
        ratios.append(during / alone)
    return statistics.median(ratios)


def bench_backends(parts: Parts, n: int, backends: tuple[str, ...] = BACKENDS) -> dict:
    """The figures above for each backend; ``n`` replays per backend and kind, in rounds of 10."""
    env = make_env(parts.env_id, parts.env_kwargs)
    obs, _ = env.reset(seed=0)
    env.close()
    runners, out = {}, {"backends": {}}
    for b in backends:
        t0 = time.perf_counter()
        policy, critic = make_runners(dataclasses.replace(parts, backend=b))
        twin = make_runners(dataclasses.replace(parts, backend=b, critic=None))[0]
        runners[b] = (policy, critic, twin)
        noise = np.random.default_rng(0).standard_normal(policy.noise_shape[1:]).astype(np.float32)
        out["backends"][b] = {
            "build_s": time.perf_counter() - t0,
            "capture_s": {"policy": policy.graph.capture_seconds, "critic": critic.graph.capture_seconds},
        }
    lat = {
        b: {
            "policy": [],
            "critic": [],
            "serial": [],
            "parallel": [],
            "two_policies_serial": [],
            "two_policies_parallel": [],
        }
        for b in backends
    }
    for _ in range(max(1, n // 10)):
        for b in backends:
            policy, critic, twin = runners[b]

            def two():
                policy.submit(obs, noise)
                twin.submit(obs, noise)
                policy.result()
                twin.result()

            def par():
                policy.submit(obs, noise)
                critic.submit(obs)
                policy.result()
                critic.result()

            kinds = {
                "policy": lambda: policy.act(obs, noise),
                "critic": lambda: critic.value(obs),
                "serial": lambda: (policy.act(obs, noise), critic.value(obs)),
                "parallel": par,
            }
            kinds.update(
                {
                    "two_policies_serial": lambda: (policy.act(obs, noise), twin.act(obs, noise)),
                    "two_policies_parallel": two,
                }
            )
            for kind, fn in kinds.items():
                fn()  # warm after the other backends ran
                for _ in range(10):
                    t0 = time.perf_counter()
                    fn()
                    lat[b][kind].append(time.perf_counter() - t0)
    for b in backends:
        policy, critic, twin = runners[b]
        r = out["backends"][b]
        med = {k: statistics.median(v) * 1e3 for k, v in lat[b].items()}
        r.update({f"{k}_ms": v for k, v in med.items()})
        r["policy_p99_ms"] = float(np.percentile(np.asarray(lat[b]["policy"]) * 1e3, 99))
        r["parallel_over_max"] = med["parallel"] / max(med["policy"], med["critic"])
        r["parallel_over_serial"] = med["parallel"] / med["serial"]
        r["two_policies_parallel_over_serial"] = _spread(
            [x / y for x, y in zip(lat[b]["two_policies_parallel"], lat[b]["two_policies_serial"])]
        )
        r["policy_over_jit"] = (
            _spread([x / y for x, y in zip(lat[b]["policy"], lat["jit"]["policy"])]) if "jit" in lat else None
        )
        r["gil_progress"] = _gil_progress(policy, obs, noise)
        a, c = policy.act(obs, noise), policy.act(obs, noise)
        r["same_bytes_across_calls"] = bool(a.tobytes() == c.tobytes())
        r["policy_max_abs_diff_vs_eager"] = float(np.abs(a - policy.act_eager(obs, noise)).max())
        r["critic_max_abs_diff_vs_eager"] = abs(critic.value(obs) - critic.value_eager(obs))
        for x in runners[b]:
            x.close()
    return out


def format_backends(r: dict, row) -> None:
    """Rows for :func:`rollcap.rollout.bench.report.format_report`."""
    for b, x in r["backends"].items():
        rel = x["policy_over_jit"]
        row(
            f"{b}: policy / critic (median)",
            f"{x['policy_ms']:.2f} / {x['critic_ms']:.2f} ms"
            + (f" (policy {rel['median']:.2f}x jit, IQR {rel['p25']:.2f}-{rel['p75']:.2f})" if rel else ""),
        )
        row(f"{b}: parallel / max, parallel / serial", f"{x['parallel_over_max']:.3f}, {x['parallel_over_serial']:.3f}")
        two = x["two_policies_parallel_over_serial"]
        row(
            f"{b}: two policies on two lanes / serial",
            f"{two['median']:.2f} (IQR {two['p25']:.2f}-{two['p75']:.2f}; 0.5 = full overlap)",
        )
        row(f"{b}: Python progress while the policy runs", f"{x['gil_progress']:.0%} of alone")
        row(
            f"{b}: capture policy / critic (build)",
            f"{x['capture_s']['policy']:.1f} / {x['capture_s']['critic']:.1f} s ({x['build_s']:.1f} s)",
        )
        row(
            f"{b}: exact across calls, max|diff| vs eager",
            f"{x['same_bytes_across_calls']}, {x['policy_max_abs_diff_vs_eager']:.2g}",
        )
