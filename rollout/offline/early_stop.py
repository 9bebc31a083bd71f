"""What a critic stop threshold would do to recorded episodes: the host's stop predicate replayed on their values.

A critic never changes an episode it does not stop: the policy's noise comes
from the episode seed, not from the critic. So an episode recorded *with* a
critic and *without* a threshold tells, for any threshold, exactly what a run
with that threshold does: it stops at the first boundary where
:class:`~rollcap.rollout.predicates.CriticBelow` fires on the recorded values
(no action of that chunk is executed), and otherwise is the same episode. One
run then answers the question a threshold raises: how many episodes it stops,
how many of those would have succeeded, the success rate with the stops, and
the env steps it saves (``rollcap inspect RUN --early-stop -0.9 -0.8``;
``tests/rollout/offline/test_early_stop.py`` checks the replay against runs
with the threshold).

Imports point downward: numpy and the episode record only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from rollcap.rollout.episode import NATURAL_ENDS
from rollcap.rollout.predicates import BoundaryView, CriticBelow


def first_stop(values: np.ndarray, threshold: float, patience: int = 2) -> int | None:
    """The boundary at which :class:`~rollcap.rollout.predicates.CriticBelow` stops on ``values`` (None: never)."""
    pred = CriticBelow(threshold, patience)
    pred.reset()
    for k, v in enumerate(np.asarray(values, np.float64)):
        if pred.check(BoundaryView(k, 0, None, float(v), 0.0)):
            return k
    return None


@dataclass(frozen=True)
class Boundaries:
    """One episode as the stop predicate sees it: the critic's value at each boundary and where each chunk began."""

    values: np.ndarray
    """``[K]`` critic values, one per chunk boundary."""
    chunk_start: np.ndarray
    """``[K]`` the step each chunk began at."""
    success: bool
    steps: int
    """Env steps the episode ran."""


@dataclass(frozen=True)
class EarlyStopRow:
    """A threshold's effect on a set of episodes."""

    threshold: float
    patience: int
    episodes: int
    stopped: int
    """Episodes the threshold stops."""
    stopped_would_succeed: int
    """Of those, the ones that succeeded without the stop (successes the threshold costs)."""
    successes: int
    """Successes without stops."""
    successes_with_stops: int
    steps: int
    """Env steps without stops."""
    steps_saved: int
    """Env steps the stops leave out."""

    def to_json(self) -> dict:
        return asdict(self)


def early_stop_rows(
    episodes: Iterable[Boundaries], thresholds: Iterable[float], patience: int = 2
) -> list[EarlyStopRow]:
    """One :class:`EarlyStopRow` per threshold over ``episodes``."""
    eps = list(episodes)
    rows = []
    for thr in thresholds:
        stopped = lost = saved = 0
        for e in eps:
            k = first_stop(e.values, thr, patience)
            if k is None:
                continue
            stopped += 1
            lost += bool(e.success)
            saved += int(e.steps - e.chunk_start[k])
        wins = sum(bool(e.success) for e in eps)
        rows.append(
            EarlyStopRow(
                float(thr),
                int(patience),
                len(eps),
                stopped,
                lost,
                wins,
                wins - lost,
                sum(int(e.steps) for e in eps),
                saved,
            )
        )
    return rows


def boundaries_of(rec, source: str = "") -> Boundaries:
    """A recorded episode's :class:`Boundaries`.

    Raises:
        ValueError: it was recorded without a critic (no values), or a stop other than its natural end cut it
            (a critic stop, a key, a limit: what it would have done is unknown), naming the episode.
    """
    where = f"{source}: " if source else ""
    values = np.asarray(rec.chunks["critic_value"], np.float64)
    if len(values) == 0 or not np.isfinite(values).all():
        raise ValueError(
            f"{where}episode {rec.index} has no critic values (recorded with `critic=none`?); record with a critic and no threshold"
        )
    if rec.stop_reason not in NATURAL_ENDS:
        raise ValueError(
            f"{where}episode {rec.index} was stopped ({rec.stop_reason}) before its natural end: record with a critic and no threshold"
        )
    return Boundaries(values, np.asarray(rec.chunks["chunk_start"], np.int64), bool(rec.success), int(rec.num_steps))


def table(rows: list[EarlyStopRow]) -> str:
    """The rows as plain text: stopped, of those would-have-succeeded, success without and with the stops, steps saved."""
    lines = [
        f"{'threshold':>9}  {'stopped':>9}  {'of them would succeed':>21}  {'success':>15}  {'with stops':>15}  {'steps saved':>11}"
    ]
    for r in rows:
        lines.append(f"{r.threshold:>9g}  {r.stopped:>4}/{r.episodes:<4}  {r.stopped_would_succeed:>21}  {r.successes / r.episodes:>7.1%} ({r.successes:>5})  "
                     f"{r.successes_with_stops / r.episodes:>7.1%} ({r.successes_with_stops:>5})  {r.steps_saved / max(1, r.steps):>11.1%}")  # fmt: skip
    lines.append(
        f"(patience {rows[0].patience}: the host's CriticBelow replayed on the recorded critic values; a stopped episode executes no action of the chunk it stops at)"
        if rows
        else ""
    )
    return "\n".join(lines)
