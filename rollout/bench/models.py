"""Bench section ``models``: the policy chunk eager vs captured, the critic, policy || critic on two lanes vs serial, capture time, exactness;
then the FlowVLA sizes from the shipped one to pi0 scale, plain and fused, per backend and precision
(:mod:`rollcap.rollout.bench.model_sizes`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rollcap.kernels.lanes import make_lane
from rollcap.rollout.bench.model_sizes import SizeSweep, bench_sizes, format_sizes
from rollcap.rollout.bench.timing import sample_obs, stats, time_calls
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_runners


def bench_models(parts: Parts, n: int, sweep: SizeSweep | None = None) -> dict:
    """The shipped checkpoint's figures, then the size sweep (``sweep``: the device's default; ``--quick``: the shipped size only)."""
    out = _bench_checkpoint(parts, n)
    sweep = (sweep or SizeSweep()).resolved(parts.device, quick=n < 100)
    out["sizes"] = bench_sizes(parts.device, dataclasses.replace(sweep, reps=min(sweep.reps, max(3, n // 20))))
    return out


def _bench_checkpoint(parts: Parts, n: int) -> dict:
    policy, critic = make_runners(parts)
    obs = sample_obs(parts)
    noise = np.random.default_rng(0).standard_normal(policy.noise_shape[1:]).astype(np.float32)
    eager_lane = make_lane("eager", parts.device, parts.threads)
    out: dict = {"capture_s": {"policy": policy.graph.capture_seconds, "critic": critic.graph.capture_seconds}}
    out["policy_captured"] = stats(time_calls(lambda: policy.act(obs, noise), n))
    out["policy_eager"] = stats(time_calls(lambda: eager_lane.run(policy.act_eager, obs, noise), n))
    out["critic_captured"] = stats(time_calls(lambda: critic.value(obs), n))
    out["critic_eager"] = stats(time_calls(lambda: eager_lane.run(critic.value_eager, obs), n))

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
        ser += time_calls(serial, 10, warm=1)
        par += time_calls(parallel, 10, warm=1)
    out["serial"] = stats(ser)
    out["parallel"] = stats(par)
    p_med, c_med = out["policy_captured"]["median_ms"], out["critic_captured"]["median_ms"]
    out["speedup_captured_vs_eager"] = out["policy_eager"]["median_ms"] / p_med
    out["parallel_over_max"] = out["parallel"]["median_ms"] / max(p_med, c_med)
    out["parallel_over_serial"] = out["parallel"]["median_ms"] / out["serial"]["median_ms"]
    a, b = policy.act(obs, noise), policy.act_eager(obs, noise)
    out["policy_bit_identical"] = bool(a.tobytes() == b.tobytes())
    out["policy_max_abs_diff"] = float(np.abs(a - b).max())
    out["critic_bit_identical"] = critic.value(obs) == critic.value_eager(obs)
    out["backend"] = policy.backend
    out["precision"] = policy.precision  # what the checkpoint's figures ran at (issue 44: the JSON said neither)
    out["sampler"] = parts.sampler
    eager_lane.close()
    policy.close()
    critic.close()
    return out


def format_models(m: dict, row) -> None:
    """The section's rows of the human table."""
    if "precision" in m:
        row("policy backend / precision / sampler", f"{m['backend']} / {m['precision']} / {m['sampler']}")
    row(
        "policy chunk eager (median / p99)",
        f"{m['policy_eager']['median_ms']:.2f} / {m['policy_eager']['p99_ms']:.2f} ms",
    )
    row(
        "policy chunk captured (median / p99)",
        f"{m['policy_captured']['median_ms']:.2f} / {m['policy_captured']['p99_ms']:.2f} ms",
    )
    row("captured speedup", f"{m['speedup_captured_vs_eager']:.2f}x")
    row(
        "critic eager / captured (median)",
        f"{m['critic_eager']['median_ms']:.2f} / {m['critic_captured']['median_ms']:.2f} ms",
    )
    row("policy then critic (serial, median)", f"{m['serial']['median_ms']:.2f} ms")
    row("policy || critic on two lanes (median)", f"{m['parallel']['median_ms']:.2f} ms")
    row("parallel / max(policy, critic)", f"{m['parallel_over_max']:.3f}")
    row("capture time policy / critic", f"{m['capture_s']['policy']:.2f} / {m['capture_s']['critic']:.2f} s")
    row(
        "policy captured == eager",
        "bit-identical" if m["policy_bit_identical"] else f"max|diff| {m['policy_max_abs_diff']:.3g}",
    )
    row("critic captured == eager", "bit-identical" if m["critic_bit_identical"] else "differs")
    if "sizes" in m:
        row(
            f"FlowVLA sizes (random weights, batch 1, guided; {m['sizes']['device']}; median of {m['sizes']['reps']} chunks):"
        )
        format_sizes(m["sizes"], row)
