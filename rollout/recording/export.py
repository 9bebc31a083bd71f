"""What the exporters share: reading a run for export, its frame rate, per-step extras, and an atomic publish.

An exporter reads a recording with rollcap's own readers
(:func:`rollcap.rollout.recording.runs.iter_any`), writes the whole target into a
temporary directory beside it, and renames it into place only when every
episode is written: a failure leaves nothing behind.

Imports point downward: ``episode``, ``inspect`` and the recording readers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np
from rollcap.rollout.episode import ACTOR_HUMAN, EpisodeRecord

EXTRAS = ("reward", "done", "success", "intervention", "critic_value")
"""Per-step extras an exporter can add beside observations and actions (all by default)."""


def check_extras(extras: Sequence[str]) -> tuple[str, ...]:
    """``extras`` as a tuple; a ValueError naming the first unknown one."""
    extras = (extras,) if isinstance(extras, str) else tuple(extras)
    for name in extras:
        if name not in EXTRAS:
            raise ValueError(f"extras: unknown feature {name!r}; known: {', '.join(EXTRAS)}")
    return extras


def read_run(run_dir) -> tuple[EpisodeRecord, Iterator[EpisodeRecord]]:
    """The first episode of a recording and an iterator over all of them (the first included), one at a time.

    Raises:
        ValueError: one line naming ``run_dir`` when it is not a readable rollcap recording or holds no episode.
    """
    from rollcap.rollout.errors import CorruptEpisode
    from rollcap.rollout.recording.runs import iter_any

    path = Path(run_dir)
    if not path.exists():
        raise ValueError(f"run_dir: {path} does not exist")
    try:
        it = iter_any(path)
        first = next(it)
    except StopIteration:
        raise ValueError(f"run_dir: {path} holds no episode") from None
    except (FileNotFoundError, CorruptEpisode, OSError) as err:
        raise ValueError(f"run_dir: {path} is not a rollcap recording ({str(err).splitlines()[0]})") from err

    def all_records() -> Iterator[EpisodeRecord]:
        yield first
        yield from it

    return first, all_records()


def frame_rate(first: EpisodeRecord, fps, run_dir) -> tuple[int, str]:
    """Frames per second for an export of the recording at ``run_dir`` (first episode ``first``), and where it came from.

    ``fps`` when given (``"given"``); else the recording's control rate (``"recorded"``: 1 / its
    ``control_period_s``); else, for a recording made before rollcap kept it, the rate of its env built
    here from the recorded id and kwargs (``"env"``), when the id is registered without importing anything.

    Raises:
        ValueError: (``fps: ...``) ``fps`` is not an integer >= 1, or the rate is unknown or not a whole number per second.
    """
    from rollcap.envs.control import frames_per_second

    if fps is not None:
        if not isinstance(fps, int) or isinstance(fps, bool) or fps < 1:
            raise ValueError(f"fps: expected an integer >= 1, got {fps!r}")
        return fps, "given"
    how = "pass the rate as fps (--fps N)"
    period, source = first.control_period_s, "recorded"
    if period is None:
        period, why = _env_period(first)
        source = "env"
        if period is None:
            raise ValueError(
                f"fps: {run_dir} does not record its control rate (recorded before rollcap kept it) and {why}; {how}"
            )
    rate = frames_per_second(period)
    if rate is None:
        raise ValueError(
            f"fps: {run_dir} steps every {period:g} s ({1 / period:.4g} Hz), not a whole number of frames per second; {how}"
        )
    return rate, source


def _env_period(rec: EpisodeRecord) -> tuple[float | None, str]:
    """The control period of ``rec``'s env built from its recorded id and kwargs (nothing imported), or None and why not."""
    import gymnasium as gym

    import rollcap.envs  # noqa: F401  (registers rollcap's ids)
    from rollcap.envs.control import control_period

    module, _, plain = rec.env_id.rpartition(":")
    if plain not in gym.registry or (module and module.split(".")[0] not in ("rollcap", "gymnasium")):
        return None, f"its env {rec.env_id!r} is not one rollcap builds without importing a module"
    try:
        env = gym.make(plain, **(rec.env_kwargs or {}))
    except Exception as err:  # a missing package (metaworld), kwargs of another release: the rate stays unknown
        return (
            None,
            f"its env {rec.env_id!r} cannot be built here ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})",
        )
    try:
        period = control_period(env)
    finally:
        env.close()
    return period, "" if period is not None else f"its env {rec.env_id!r} has no dt"


def step_extras(rec: EpisodeRecord) -> dict[str, np.ndarray]:
    """Per-step ``[T]`` arrays: reward, done, success (True on the last step of a successful episode),
    intervention (a human acted), critic_value (the value at the boundary of the step's chunk; NaN without a critic)."""
    t = rec.num_steps
    success = np.zeros(t, np.bool_)
    if rec.success and t:
        success[-1] = True
    starts = rec.chunks["chunk_start"]
    k = np.clip(np.searchsorted(starts, np.arange(t), side="right") - 1, 0, None)
    value = rec.chunks["critic_value"][k] if len(starts) else np.full(t, np.nan, np.float32)
    return {
        "reward": rec.steps["rewards"],
        "done": rec.steps["dones"],
        "success": success,
        "intervention": rec.steps["actor"] == ACTOR_HUMAN,
        "critic_value": value.astype(np.float32),
    }


def check_target(target: Path, arg: str) -> None:
    """Refuse an existing target that is not an empty directory (a ValueError naming ``arg``)."""
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ValueError(f"{arg}: {target} exists and is not an empty directory; choose another or remove it")


@contextmanager
def staged(target: Path, arg: str) -> Iterator[Path]:
    """A fresh path beside ``target`` (not yet created) to write into; renamed to ``target`` on success, removed on failure."""
    check_target(target, arg)
    made = [d for d in (target.parent, *target.parent.parents) if not d.exists()]  # deepest first
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    done = False
    try:
        yield tmp / "out"
        check_target(target, arg)  # nobody took it meanwhile
        if target.is_dir():
            target.rmdir()
        os.replace(tmp / "out", target)
        done = True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made if not done else ():  # a failure leaves no directory it made either
            try:
                d.rmdir()
            except OSError:
                break


def without_empty(records: Iterator[EpisodeRecord], skipped: list[int]) -> Iterator[EpisodeRecord]:
    """Episodes with at least one step (an episode stopped at its first boundary has no frame); the others' indices go to ``skipped``."""
    for rec in records:
        if rec.num_steps:
            yield rec
        else:
            skipped.append(rec.index)


def lazy_import(module: str, install: str) -> ModuleType:
    """``importlib.import_module(module)`` or an ImportError that says how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{module} is not importable here; {install}") from err
