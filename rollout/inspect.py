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

from rollcap.kernels.files import atomic_write
from rollcap.rollout.episode import ACTOR_HUMAN, EpisodeRecord
from rollcap.rollout.recording import EPISODES_DIR, H5_NAME, h5_indices, read_h5_episode, read_npz
from rollcap.rollout.recording.codec import corrupt
from rollcap.rollout.recording.npz import npz_name_index

_ZIP_MAGIC, _HDF5_MAGIC = b"PK\x03\x04", b"\x89HDF\r\n\x1a\n"


def load_any(path) -> list[EpisodeRecord]:
    """Episodes from an ``.npz`` file, an HDF5 file, or a run directory, sorted by index.

    A run directory is read from its ``episodes/episode_NNNNN.npz`` when it
    has any (each must hold the episode its name gives), else from
    ``episodes.hdf5``. The whole run is in memory at once: to go through a
    large run, iterate :func:`iter_any` instead.

    Raises:
        CorruptEpisode: a file that is neither format, a damaged one, or an
            npz of a run directory holding another episode than its name says.
        FileNotFoundError: nothing to read at ``path``.
    """
    return list(iter_any(path))


def iter_any(path) -> Iterator[EpisodeRecord]:
    """The episodes :func:`load_any` returns, in the same order, read one at a time.

    Memory stays that of one episode however large the run. The path is
    checked on the first ``next()``; the errors are :func:`load_any`'s.
    """
    path = Path(path)
    if path.is_dir():
        npz = _named_npz(path / EPISODES_DIR) or _named_npz(path)
        if npz:  # sorted by the index in the name, and each file must hold that index
            for i, p in npz:
                yield read_npz(p, expect_index=i)
            return
        if (path / H5_NAME).is_file():
            yield from _iter_h5(path / H5_NAME)
            return
        raise FileNotFoundError(f"{path}: no {EPISODES_DIR}/episode_*.npz and no {H5_NAME}; is it a run directory?")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or run directory")
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith(_ZIP_MAGIC):
        yield read_npz(path)
    elif head == _HDF5_MAGIC:
        yield from _iter_h5(path)
    else:
        raise corrupt(path, "neither an npz archive nor an HDF5 file")


def _iter_h5(path: Path) -> Iterator[EpisodeRecord]:
    """``read_h5(path)``, one demo at a time (each read under its own short shared lock)."""
    for i in h5_indices(path):
        yield read_h5_episode(path, i)


def _named_npz(directory: Path) -> list[tuple[int, Path]]:
    """``(index, path)`` of the ``episode_NNNNN.npz`` files in ``directory``, by name."""
    found: dict[int, Path] = {}
    for p in sorted(directory.glob("episode_*.npz")):
        i = npz_name_index(p)
        if i is not None and found.setdefault(i, p) != p:
            raise corrupt(p, f"names episode {i}, as {found[i].name} does; keep one file per episode")
    return sorted(found.items())


def _fmt(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.3f}"


def episode_table(records: Iterable[EpisodeRecord], instruction_width: int = 40) -> str:
    """A plain-text table, one row per episode (``records`` is gone through once: pass :func:`iter_any` for a large run).

    Columns: index, seed, steps, chunks, human (steps a person acted), stop
    reason, success, mean / min critic value over the chunks, instruction
    (cut to ``instruction_width`` characters).
    """
    header = ("index", "seed", "steps", "chunks", "human", "stop", "success", "v_mean", "v_min", "instruction")
    rows = []
    n = ok = steps = 0
    for r in records:
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
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    if n:
        out.append(f"{n} episode(s), {ok} successful ({ok / n:.0%}), {steps} steps")
    return "\n".join(out)


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
            ax.axvspan(lo - 0.5, hi - 0.5, color="tab:orange", alpha=0.2, lw=0, label="human" if i == 0 and ax is ax_a else None)
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
    """Raise ``ValueError`` (one line naming ``out_dir``) unless ``out_dir`` is a directory or can be made one.

    Checks only; call it before loading so a bad ``--plot DIR`` costs nothing.
    """
    out_dir = Path(out_dir)
    for p in (out_dir, *out_dir.parents):
        if p.is_dir():
            return out_dir
        if p.exists():
            what = "is a file" if p == out_dir else f"cannot be made: {p} is a file"
            raise ValueError(f"plot directory {out_dir} {what}; name a directory (it is created if missing)")
    return out_dir


def plot_episodes(records: list[EpisodeRecord], out_dir) -> Iterator[Path]:
    """Write ``out_dir/episode_NNNNN.png`` for each record (see :func:`plot_episode`), creating ``out_dir``;
    for branches, also ``branches_<episode>_chunk<K>.png`` per boundary (:func:`~rollcap.rollout.calibrate.plot_fans`).

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
        from rollcap.rollout.calibrate import plot_fans

        yield from plot_fans(records, out_dir)
