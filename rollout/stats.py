"""Success rates as claims about seeds: Wilson intervals, paired differences, exact McNemar; and how well scores
order candidates at one state (pairwise agreement, resampled over states).

One implementation for every report that states a success rate (``rollcap run``'s
summary, branch values, RECAP's before/after, DSRL, the RTC benchmark).
"""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float, float]:
    """Rate ``k / n`` and its Wilson score interval (95% for ``z = 1.96``); ``n = 0`` gives ``(nan, 0, 1)``."""
    if n == 0:
        return float("nan"), 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return p, max(0.0, mid - half), min(1.0, mid + half)


def mcnemar_p(fixed: int, broken: int) -> float:
    """Exact two-sided McNemar p: the discordant pairs (``fixed``: 0 -> 1, ``broken``: 1 -> 0) against Binomial(n, 1/2)."""
    n = fixed + broken
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(fixed, broken) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_difference(fixed: int, broken: int, n: int, z: float = 1.96) -> tuple[float, float, float]:
    """Difference of two success rates over the same ``n`` episodes, ``(fixed - broken) / n``, and its 95% interval.

    The interval is Bonett and Price's adjusted Wald interval for paired proportions (2012): the discordant counts
    plus one each over ``n + 2``, clipped to [-1, 1]. The plain Wald interval it replaced has no width when no
    episode differs (``+0.0 to +0.0`` at n = 3); this one does (about +-0.55 there), and at n = 200 the two agree
    to a point or so.
    """
    d = (fixed - broken) / n
    p12, p21 = (fixed + 1) / (n + 2), (broken + 1) / (n + 2)
    centre = p12 - p21
    half = z * math.sqrt(max(p12 + p21 - centre**2, 0.0) / (n + 2))
    return d, max(centre - half, -1.0), min(centre + half, 1.0)


def rate_line(k: int, n: int) -> str:
    """``91.5% [86.8, 94.6] (183/200)``: a success rate as a report states it."""
    if n == 0:
        return "-"
    p, lo, hi = wilson(k, n)
    return f"{p:.1%} [{lo * 100:.1f}, {hi * 100:.1f}] ({k}/{n})"


def pairwise_agreement(scores, outcomes, resamples: int = 2000) -> dict | None:
    """How often ``scores`` order two candidates at one state as their ``outcomes`` do, over the pairs whose outcomes
    differ (0.5 is chance), with a 95% interval from resampling states (the pairs at one state share its scores, so
    they are not independent). ``scores`` and ``outcomes`` hold one sequence per state; None when no pair differs."""
    import numpy as np

    per = []  # (agreeing, pairs) per state
    for q, y in zip(scores, outcomes):
        q, y = np.asarray(q), np.asarray(y, bool)
        i, j = np.triu_indices(len(y), 1)
        d = y[i] != y[j]
        if d.any():
            per.append((((q[i] > q[j]) == y[i])[d].sum(), d.sum()))
    if not per:
        return None
    a = np.array(per, float)
    boot = np.random.default_rng(0).integers(0, len(a), (resamples, len(a)))
    frac = a[boot, 0].sum(1) / a[boot, 1].sum(1)
    return {"states": len(a), "pairs": int(a[:, 1].sum()), "agreement": float(a[:, 0].sum() / a[:, 1].sum()),
            "ci95": [float(np.quantile(frac, 0.025)), float(np.quantile(frac, 0.975))]}  # fmt: skip
