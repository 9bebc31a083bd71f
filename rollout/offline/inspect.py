"""Looking at recorded episodes: load any recording, tabulate, plot.

The CLI calls these; nothing here writes a recording. Plotting needs
matplotlib (``pip install 'rollcap[plot]'``) and uses its Agg canvas only, so it
works headless and leaves pyplot's global state alone; each PNG is written
atomically, into a directory :func:`check_plot_dir` accepted first.

Imports point downward: this module knows ``kernels.files``, ``episode``,
``errors`` and the recording modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from rollcap.kernels.files import atomic_write, cannot_create_dir
from rollcap.rollout.episode import ACTOR_HUMAN, EpisodeRecord
from rollcap.rollout.recording import iter_episodes
from rollcap.rollout.recording.runs import source_index


def _fmt(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.3f}"


def episode_table(records: Iterable, instruction_width: int = 40, unreadable: list | None = None) -> str:
    """A plain-text table, one row per episode (``records`` is gone through once: pass :func:`iter_any` for a large run).

    Columns: index, seed, steps, chunks, human (steps a person acted), stop
    reason, success, mean / min critic value over the chunks, instruction
    (cut to ``instruction_width`` characters). ``records`` may also hold
    :func:`~rollcap.rollout.recording.iter_episodes`' ``(source, record or
    error)`` pairs: an episode that cannot be read is a row marked ``BAD``,
    its file and error are listed under the table, and the last line counts them
    (and each ``(source, error)`` is appended to ``unreadable``, when given).
    """
    header = ("index", "seed", "steps", "chunks", "human", "stop", "success", "v_mean", "v_min", "instruction")
    rows, bad = [], []
    n = ok = steps = 0
    for item in records:
        source, r = item if isinstance(item, tuple) else (None, item)
        if isinstance(r, Exception):
            bad.append(f"  BAD {source}: {_error(source, r)}")
            if unreadable is not None:
                unreadable.append((source, r))
            index = source_index(source)
            rows.append(
                ("?" if index is None else str(index), "-", "-", "-", "-", "BAD", "-", "-", "-", "(unreadable)")
            )
            continue
        n, ok, steps = n + 1, ok + bool(r.success), steps + r.num_steps
        v = r.chunks["critic_value"].astype(np.float64)
        v = v[np.isfinite(v)]
        text = " ".join(r.instruction.split())
        if len(text) > instruction_width:
            text = text[: instruction_width - 1] + "…"
        rows.append(
            (
                str(r.index),
                str(r.seed),
                str(r.num_steps),
                str(r.num_chunks),
                str(int(np.count_nonzero(r.steps["actor"] == ACTOR_HUMAN))),
                r.stop_reason,
                "yes" if r.success else "no",
                _fmt(v.mean()) if v.size else "-",
                _fmt(v.min()) if v.size else "-",
                text,
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    numeric = {0, 1, 2, 3, 4, 7, 8}

    def line(cells) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    out += bad
    counts = [f"{n} episode(s), {ok} successful ({ok / n:.0%}), {steps} steps"] if n else []
    whole = sum(row[0] == "?" and row[5] == "BAD" for row in rows)  # a file unreadable as a whole
    unread = [f"{len(bad) - whole} episode(s)"] * (len(bad) > whole) + [f"{whole} file(s)"] * bool(whole)
    counts += [f"{' and '.join(unread)} unreadable (BAD above)"] if bad else []
    if counts:
        out.append("; ".join(counts))
    return "\n".join(out)


def readable_episodes(path) -> Iterator[EpisodeRecord]:
    """The episodes of ``path`` that can be read, one at a time (:func:`episode_table` lists the others)."""
    return (rec for _, rec in iter_episodes(path) if not isinstance(rec, Exception))


def _error(source: str | None, err: Exception) -> str:
    """The error without the file name it repeats."""
    text = str(err)
    return text[len(source) + 2 :] if source and text.startswith(f"{source}: ") else text


def _spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of every run of True in ``mask``."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def plot_episode(record: EpisodeRecord, png_path) -> Path:
    """Write a PNG: the critic value at each chunk boundary, and the executed actions per step.

    Human-intervention steps are shaded; the stop point (after the last
    executed step) is a dashed line, the stop reason in the legend; a chunk
    stopped before execution is a red cross.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'rollcap[plot]'``).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plot_episode needs matplotlib: pip install 'rollcap[plot]'") from err

    t = record.num_steps
    starts = record.chunks["chunk_start"]
    values = record.chunks["critic_value"]
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax_v, ax_a = fig.subplots(2, 1, sharex=True, height_ratios=(1, 2))
    ax_v.step(starts, values, where="post", color="tab:blue", marker="o", ms=3, label="critic value")
    unexecuted = starts >= t
    if unexecuted.any():
        ax_v.plot(starts[unexecuted], values[unexecuted], "x", color="tab:red", ms=8, mew=2, label="not executed")
    ax_v.set_ylabel("critic value")
    actions = record.steps["actions"]
    actions = actions.reshape(t, int(np.prod(actions.shape[1:], dtype=np.int64)))
    steps = np.arange(t)
    for j in range(actions.shape[1]):
        ax_a.plot(steps, actions[:, j], lw=1, label=f"a{j}")
    human = _spans(record.steps["actor"] == ACTOR_HUMAN)
    for i, (lo, hi) in enumerate(human):
        for ax in (ax_v, ax_a):
            ax.axvspan(
                lo - 0.5,
                hi - 0.5,
                color="tab:orange",
                alpha=0.2,
                lw=0,
                label="human" if i == 0 and ax is ax_a else None,
            )
    for ax in (ax_v, ax_a):
        ax.axvline(t - 0.5, color="k", ls="--", lw=1, label=f"stop: {record.stop_reason}" if ax is ax_a else None)
    if t == 0:
        ax_a.text(0.5, 0.5, "no step executed", transform=ax_a.transAxes, ha="center", va="center", color="0.4")
    ax_a.set_xlabel("env step")
    ax_a.set_ylabel("executed action")
    ax_a.set_xlim(-1.5, max(t, int(starts.max(initial=0))) + 1)
    ax_a.legend(loc="upper left", fontsize=7, ncol=min(actions.shape[1] + 2, 9))
    ax_v.legend(loc="upper right", fontsize=7)
    outcome = "success" if record.success else "failure"
    fig.suptitle(f"episode {record.index} (seed {record.seed}, {outcome}): {record.instruction}", fontsize=10)
    png_path = Path(png_path)
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    return png_path


def check_plot_dir(out_dir) -> Path:
    """Raise ``ValueError`` (one line naming ``out_dir``) unless ``out_dir`` is a directory or can be made one, and matplotlib is installed.

    Checks only; call it before loading so a bad ``--plot DIR`` costs nothing.
    """
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"plotting into {out_dir} needs matplotlib: pip install 'rollcap[plot]'")
    out_dir = Path(out_dir)
    for p in (out_dir, *out_dir.parents):
        if p.is_dir():
            break
        if p.exists():
            what = "is a file" if p == out_dir else f"cannot be made: {p} is a file"
            raise ValueError(f"plot directory {out_dir} {what}; name a directory (it is created if missing)")
    why = cannot_create_dir(out_dir)  # made and removed at once: /proc/plots passed the checks above, then failed
    if why is not None:
        raise ValueError(f"plot directory {why}; name a directory you can write")
    return out_dir


def plot_episodes(records: list[EpisodeRecord], out_dir) -> Iterator[Path]:
    """Write ``out_dir/episode_NNNNN.png`` for each record (see :func:`plot_episode`), creating ``out_dir``;
    for branches, also ``branches_<episode>_chunk<K>.png`` per boundary (:func:`plot_fans`).

    Yields each path once written (each PNG is written atomically).

    Raises:
        ValueError: ``out_dir`` is a file, lies under one, or cannot be created (one line naming it).
        ImportError: matplotlib is not installed.
    """
    out_dir = check_plot_dir(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"plot directory {out_dir} cannot be created ({err.strerror or err})") from err
    for r in records:
        yield plot_episode(r, out_dir / f"episode_{r.index:05d}.png")
    if any(r.origin is not None for r in records):  # branches (rollcap branch): one fan per boundary
        yield from plot_fans(records, out_dir)


def plot_fans(records, out_dir) -> list[Path]:
    """One PNG per boundary the branches among ``records`` start from: every branch fanning out from it.

    Top: each branch's critic value at its chunk boundaries; bottom: its return
    accumulated from the boundary; both over the parent's step count, so every
    line starts at the branch point. The control (the parent's own noise) is
    black, a success ends in a star. Records without ``origin`` are ignored.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'rollcap[plot]'``).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("the branch plot needs matplotlib: pip install 'rollcap[plot]'") from err

    groups: dict[tuple, list] = {}
    for r in records:
        if r.origin is not None:
            groups.setdefault(
                (str(r.origin.get("parent", "")), int(r.origin["episode"]), int(r.origin["chunk"])), []
            ).append(r)
    paths = []
    for (parent, episode, chunk), rs in sorted(groups.items()):
        t0 = int(rs[0].origin["step"])
        fig = Figure(figsize=(9, 5.5), layout="constrained")
        ax_v, ax_r = fig.subplots(2, 1, sharex=True)
        for r in sorted(rs, key=lambda r: r.origin["branch"]):
            control = r.origin.get("noise") == "parent"
            style = {"color": "k", "lw": 2.0, "zorder": 3} if control else {"lw": 1.0, "alpha": 0.8}
            label = "control (parent's noise)" if control else None
            starts = t0 + r.chunks["chunk_start"]
            ax_v.step(starts, r.chunks["critic_value"], where="post", label=label, **style)
            steps = t0 + np.arange(r.num_steps + 1)
            ret = np.concatenate([[0.0], np.cumsum(r.steps["rewards"])])
            line = ax_r.plot(steps, ret, label=label, **style)[0]
            if r.success:
                ax_r.plot(steps[-1], ret[-1], "*", ms=10, color=line.get_color())
        for ax in (ax_v, ax_r):
            ax.axvline(t0, color="0.5", ls=":", lw=1)
        ax_v.set_ylabel("critic value")
        ax_r.set_ylabel("return from the boundary")
        ax_r.set_xlabel("env step of the parent episode")
        if any(r.origin.get("noise") == "parent" for r in rs):
            ax_v.legend(loc="lower left", fontsize=7)
        wins = sum(bool(r.success) for r in rs)
        fig.suptitle(
            f"{len(rs)} branches of episode {episode} at chunk {chunk} (step {t0}); {wins} successful (*)\n{parent}",
            fontsize=9,
        )
        path = Path(out_dir) / f"branches_{episode:05d}_chunk{chunk:03d}.png"
        atomic_write(path, lambda tmp, fig=fig: fig.savefig(tmp, dpi=100, format="png"))
        paths.append(path)
    return paths
