"""RECAP stage 3, advantage: N-step advantages of every collected step, binarised per task.

With the critic's scale (value = ``-steps_to_success / max_steps``) each step
costs ``r = -1 / max_steps``, so

    A_t = N * r + V(o_{t+N}) - V(o_t)                 while o_{t+N} is inside the episode,
    A_t = G_t - V(o_t)                                  near its end (Monte-Carlo),

with ``G_t`` the step's value target (:func:`~rollcap.rollout.learn.recap.value.value_targets`:
the realised return of a natural end, the bootstrapped one of a censored
episode). The indicator is positive where ``A_t`` lies above the task's
``percentile``-th percentile of advantages (a task is an env id; the
percentile is a :class:`~rollcap.rollout.learn.recap.config.RecapConfig` field, 60
by default: the better 40% of the policy's own steps are "positive").
Steps a person chose (interventions) are positive whatever their advantage.
"""

from __future__ import annotations

import numpy as np

from rollcap.policies import ADV_NEGATIVE, ADV_POSITIVE
from rollcap.rollout.learn.recap.collect import Steps


def advantages(steps: Steps, values: np.ndarray, v_final: np.ndarray, targets: np.ndarray, n: int) -> np.ndarray:
    """``A_t`` of every step (see the module docstring); ``values`` are ``V(o_t)``, ``v_final`` each episode's ``V(o_T)``."""
    rows = steps.episodes
    m = np.array([r["max_steps"] for r in rows], np.float64)[steps.episode]
    t_len = np.array([r["steps"] for r in rows])[steps.episode]
    ahead = steps.t + n
    inside = ahead < t_len
    j = np.clip(np.arange(len(steps)) + n, 0, len(steps) - 1)  # rows of one episode are consecutive
    v_ahead = np.where(inside, values[j], 0.0)
    a = np.where(inside, -n / m + v_ahead - values, targets - values)
    return a.astype(np.float32)


def binarise(steps: Steps, adv: np.ndarray, percentile: float) -> tuple[np.ndarray, dict]:
    """The indicator per step (``ADV_POSITIVE`` / ``ADV_NEGATIVE``) and the per-task thresholds and label statistics."""
    tasks = np.array([r["task"] for r in steps.episodes])[steps.episode] if len(steps) else np.zeros(0, str)
    success = np.array([r["success"] for r in steps.episodes], bool)[steps.episode] if len(steps) else np.zeros(0, bool)
    labels = np.full(len(steps), ADV_NEGATIVE, np.int64)
    report = {}
    for task in sorted(set(tasks.tolist())):
        sel = tasks == task
        thr = float(np.percentile(adv[sel], percentile))
        labels[sel & (adv > thr)] = ADV_POSITIVE
        report[task] = {"threshold": thr, "percentile": float(percentile), "steps": int(sel.sum())}
    labels[steps.human] = ADV_POSITIVE
    pos = labels == ADV_POSITIVE
    stats = {
        "tasks": report,
        "positive_fraction": float(pos.mean()) if len(pos) else float("nan"),
        "positive_fraction_in_successes": float(pos[success].mean()) if success.any() else float("nan"),
        "positive_fraction_in_failures": float(pos[~success].mean()) if (~success).any() else float("nan"),
        "human_steps": int(steps.human.sum()),
        "advantage": {
            "mean": float(adv.mean()),
            "p10": float(np.percentile(adv, 10)),
            "p50": float(np.percentile(adv, 50)),
            "p90": float(np.percentile(adv, 90)),
        }
        if len(adv)
        else {},
    }
    return labels, stats
