"""The held-out side of a flow-RL run: a policy checkpoint on episodes nobody trained or chose settings on, paired.

:func:`play` runs a checkpoint exactly as ``rollcap run --policy CKPT --seed S --critic none --execute-steps E``
runs it (batch 1, the plain sampler, each episode's own derived noise; with ``zero_noise`` also all-zero noise),
so the starting policy's side is the figure every earlier table quotes for that stream. :func:`compare` pairs a
fine-tuned policy's outcomes with the starting policy's on the same episodes (Wilson intervals, McNemar).
"""

from __future__ import annotations

import numpy as np

from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.learn.flow_rl.rollouts import task_parts
from rollcap.rollout.stats import mcnemar_p, paired_difference, wilson


def play(task, policy, eval_seed: int, episodes: int, zero_noise: bool = True, progress=None) -> dict:
    """``policy`` (a checkpoint path; None: the shipped one) on episodes ``0 .. episodes-1`` of run seed
    ``eval_seed``: ``{"own": [success...], "zero_noise": [...]}``."""
    parts = task_parts(task, policy, 1)
    env = make_env(parts.env_id, parts.env_kwargs)
    runner, _ = make_runners(parts, env)
    host = RolloutHost(
        env, runner, None, HostConfig(execute_steps=task.execute_steps, seed=int(eval_seed)), records=False
    )
    try:
        own = [bool(host.run_episode(i).success) for i in range(episodes)]
        if progress is not None:
            progress(f"{policy or 'shipped'}: own noise {sum(own)}/{episodes}")
        out = {"own": own, "weights": runner.state_fingerprint()["weights_digest"]}
        if zero_noise:
            blank = np.zeros(runner.chunk_shape, np.float32)
            zero = []
            for i in range(episodes):
                host.start(i)
                while not host.done:
                    host.boundary(blank)
                    if not host.done:
                        host.execute()
                zero.append(bool(host.finish().success))
            out["zero_noise"] = zero
            if progress is not None:
                progress(f"{policy or 'shipped'}: zero noise {sum(zero)}/{episodes}")
        return out
    finally:
        host.close()


def compare(tuned: list[bool], start: list[bool]) -> dict:
    """``tuned`` against ``start`` on the same episodes: rates with 95% Wilson intervals, fixed / broken, McNemar."""
    n = len(start)
    if len(tuned) != n:
        raise ValueError(f"compare: {len(tuned)} outcomes against {n}")
    fixed = sum(a and not b for a, b in zip(tuned, start))
    broken = sum(b and not a for a, b in zip(tuned, start))
    return {"episodes": n, "tuned": int(sum(tuned)), "start": int(sum(start)), "tuned_wilson": wilson(sum(tuned), n),
            "start_wilson": wilson(sum(start), n), "fixed": fixed, "broken": broken, "mcnemar_p": mcnemar_p(fixed, broken),
            "difference_and_95ci": paired_difference(fixed, broken, n)}  # fmt: skip


def line(name: str, c: dict) -> str:
    """One line of a :func:`compare` result."""
    n = c["episodes"]
    (_, lo, hi), (d, dlo, dhi) = c["tuned_wilson"], c["difference_and_95ci"]
    return (f"{name}: {c['tuned']}/{n} = {c['tuned'] / n:.1%} (95% Wilson {lo:.1%}-{hi:.1%}) vs start {c['start']}/{n} = "
            f"{c['start'] / n:.1%}: {100 * d:+.1f} points (95% CI {100 * dlo:+.1f} to {100 * dhi:+.1f}), "
            f"{c['fixed']} fixed / {c['broken']} broken, McNemar p = {c['mcnemar_p']:.3g}")  # fmt: skip
