"""Critic calibration: the critic's value against the Monte-Carlo value of seeded branches, over many boundaries.

For every ``every``-th chunk boundary of every episode of a recording,
:func:`calibrate` runs ``n`` seeded branches (:mod:`rollcap.rollout.offline.branch`;
one pass over each episode's prefix for all of its boundaries) and compares the
critic's recorded value there with the branches' mean critic target
(``-steps_to_success / max_steps``, ``-1`` on failure). The report: Pearson
and Spearman correlation, mean error (critic minus Monte-Carlo), mean absolute
error, RMSE, and a reliability plot (Monte-Carlo value per bin of critic value,
and every boundary with its 95% interval). A well-calibrated critic lies on
the diagonal.

Imports point downward: this module knows ``branch``, ``recording.runs`` and ``kernels.files``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from rollcap.kernels.files import atomic_write, canonical_json, write_report
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.offline.branch import boundaries, check_branchable, max_steps_of, run_branches
from rollcap.rollout.recording.runs import episodes_of


def load_for_calibration(path, episode: int | None = None) -> list[tuple[str, object]]:
    """``(source, record)`` of every readable episode at ``path`` (or episode ``episode`` only), all of one env.

    Raises:
        ConfigError: nothing to calibrate on (no such episode, or every one damaged; naming ``episode``
            when one was asked for), or episodes of more than one env.
    """
    items = [
        (s, r) for s, r in episodes_of(path) if not isinstance(r, Exception) and (episode is None or r.index == episode)
    ]
    if not items:
        raise ConfigError(
            "episode" if episode is not None else "path",
            f"{path}: no readable episode{'' if episode is None else f' {episode}'} to calibrate on",
        )
    env = (items[0][1].env_id, canonical_json(items[0][1].env_kwargs))
    for source, rec in items[1:]:
        if (rec.env_id, canonical_json(rec.env_kwargs)) != env:
            raise ConfigError("episode", f"{source}: episode {rec.index} was recorded in {rec.env_id} {canonical_json(rec.env_kwargs)}, "
                              f"episode {items[0][1].index} in {env[0]} {env[1]}; calibrate one env at a time (pick one with `episode`)")  # fmt: skip
    return items


def check_calibration(parents, env, n: int, out) -> None:
    """Everything :func:`calibrate` would otherwise find late, checked before anything runs or is written.

    ``env``: the parents' env (``None``: the checks that need none, before it is built).

    Raises:
        ConfigError: ``n`` < 2, ``out`` a file, or a parent that cannot be branched (no exact state,
            real-time chunking, no step limit; naming its file).
        ImportError: matplotlib missing (the reliability plot).
    """
    if n < 2:
        raise ConfigError("n", f"calibration needs at least 2 branches per boundary for an interval, got {n}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    _figure()
    for source, rec in parents if env is not None else ():
        check_branchable(rec, env, str(source))
        max_steps_of(rec, env, str(source))


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for v in np.unique(x):  # ties share their mean rank
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def calibration_stats(critic: np.ndarray, mc: np.ndarray) -> dict:
    """Correlation and error of critic values against Monte-Carlo values (NaN correlation when either is constant)."""
    critic, mc = np.asarray(critic, np.float64), np.asarray(mc, np.float64)
    err = critic - mc
    return {
        "boundaries": int(len(critic)),
        "pearson": _corr(critic, mc),
        "spearman": _corr(_ranks(critic), _ranks(mc)),
        "mean_error": float(err.mean()) if len(err) else float("nan"),
        "mae": float(np.abs(err).mean()) if len(err) else float("nan"),
        "rmse": float(np.sqrt((err**2).mean())) if len(err) else float("nan"),
    }


def calibrate(
    parents, host_for: Callable, n: int, every: int, out, *, pool=None, seed: int | None = None, log=lambda line: None
) -> dict:
    """Monte-Carlo values at every ``every``-th boundary of ``parents``; writes ``out/calibration.json`` and ``.png``.

    Args:
        parents: ``(source, EpisodeRecord)`` pairs (:func:`load_for_calibration`).
        host_for: record -> a host over the recording's env with its config.
        n: seeded branches per boundary (no control: the parent's own continuation is known).
        pool: run the branches on Ray actors (see :func:`~rollcap.rollout.offline.branch.run_branches`).

    Returns the report (``points`` per boundary and ``stats``).

    Raises:
        ConfigError / ImportError: as :func:`check_calibration`, before anything runs.
    """
    if not parents:
        raise ValueError("calibrate: no parent episodes")
    first = host_for(parents[0][1])
    check_calibration(parents, first.env, n, out)  # the parents share one env (load_for_calibration)
    points = []
    for i, (source, rec) in enumerate(parents):
        host = first if i == 0 else host_for(rec)
        ks = list(range(0, rec.num_chunks, every))
        for k, at in boundaries(rec, host.env, ks, parent=str(source)).items():
            res = run_branches(host, rec, k, n, control=False, parent=str(source), at=at, pool=pool, seed=seed)
            points.append({"source": str(source), **res.mc.to_json()})
            log(res.mc.line())
    critic = np.array([p["critic"] for p in points])
    mc = np.array([p["value"][0] for p in points])
    report = {"n": n, "every": every, "stats": calibration_stats(critic, mc), "points": points}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "calibration.json", report)
    plot_reliability(report, out / "calibration.png")
    return report


def _figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("the reliability plot needs matplotlib: pip install 'rollcap[plot]'") from err
    return Figure


def plot_reliability(report: dict, png_path, bins: int = 10) -> Path:
    """The reliability plot: each boundary's Monte-Carlo value (95% interval) against the critic's, binned means, the diagonal.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'rollcap[plot]'``).
    """
    Figure = _figure()
    pts = report["points"]
    critic = np.array([p["critic"] for p in pts])
    mc = np.array([[*p["value"]] for p in pts]).reshape(-1, 3)
    fig = Figure(figsize=(6, 6), layout="constrained")
    ax = fig.subplots()
    ax.plot([-1, 0], [-1, 0], color="0.6", ls="--", lw=1, label="calibrated")
    lo, hi = np.clip(mc[:, 1], -1.5, 0.5), np.clip(mc[:, 2], -1.5, 0.5)
    ax.errorbar(
        critic,
        mc[:, 0],
        yerr=[mc[:, 0] - lo, hi - mc[:, 0]],
        fmt="o",
        ms=3,
        alpha=0.5,
        lw=0.8,
        label="boundary (95% CI)",
    )
    edges = np.linspace(-1, 0, bins + 1)
    which = np.clip(np.digitize(critic, edges) - 1, 0, bins - 1)
    centers = [(critic[which == b].mean(), mc[which == b, 0].mean()) for b in range(bins) if (which == b).any()]
    if centers:
        ax.plot(*zip(*centers), "s-", color="tab:red", label="binned mean")
    s = report["stats"]
    ax.set_title(
        f"critic vs Monte-Carlo value: r={s['pearson']:.2f}, MAE={s['mae']:.3f}, {s['boundaries']} boundaries, n={report['n']}",
        fontsize=9,
    )
    ax.set_xlabel("critic value at the boundary")
    ax.set_ylabel("Monte-Carlo value (mean critic target of the branches)")
    ax.set_xlim(-1.05, 0.05)
    ax.set_ylim(-1.05, 0.05)
    ax.legend(loc="upper left", fontsize=8)
    png_path = Path(png_path)
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    return png_path
