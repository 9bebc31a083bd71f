"""What env workers' deaths cost a run, and what follows from them: the parent's bookkeeping of faults.

A worker that dies at any moment (killed, crashed; mid-chunk, between
episodes, while it starts) is replaced by a worker with a new shard, and ends
its slots' episodes. One it had written whole to its shard before the parent
heard of it is named from there (:attr:`Losses.kept`; the shard repaired
first, as a resume repairs one), so no episode is in two shards; every other is
listed in :attr:`Losses.lost` with stop reason ``worker_lost`` and an error
naming the worker, and runs again (from its start, the same bytes) on another
worker. A worker runs one lost episode at a time (:meth:`Losses.suspect`), so
an episode that kills its worker takes no other with it twice; one lost
:data:`MAX_TRIES` times is given up (:attr:`Losses.failed`). A worker that
dies :data:`MAX_TRIES` times in a row before it is ready, or more deaths than
:data:`MAX_TRIES` a worker, end the run (:class:`RecordingFailed`).

Imports point downward: ``errors``, ``protocols``.
"""

from __future__ import annotations

from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.protocols import EpisodeEnd

MAX_TRIES = 3
"""Times an episode may be lost with its worker before it is given up (and deaths in a row of a starting worker)."""


class Losses:
    """A run's worker deaths and lost episodes (see the module docstring); ``workers``: how many the run has."""

    def __init__(self, workers: int):
        self.workers = workers
        self.lost: list[EpisodeEnd] = []
        """Episodes a dying worker ended (stop reason ``worker_lost``; each ran again unless in :attr:`failed`)."""
        self.failed: dict[int, str] = {}
        """Episodes given up after :data:`MAX_TRIES` losses: index -> why."""
        self.kept: list[dict] = []
        """Episodes a dying worker had written whole, not yet named in the manifest: named from its shard, not run again."""
        self.deaths: list[dict] = []
        """Every worker death (not a stop the parent asked for): worker, pid, how (signal or exit code), when (while
        starting, mid-episode, between episodes)."""
        self.restarts = 0
        self.tries: dict[int, int] = {}

    def suspect(self, index: int) -> bool:
        """Whether episode ``index`` was lost with a worker before (a worker runs one such episode at a time)."""
        return bool(self.tries.get(index))

    def pick(self, waiting, holding) -> tuple[int, int] | None:
        """The first ``(index, seed)`` of ``waiting`` (a deque, taken out of it) a worker holding episodes ``holding`` may
        run: not a second :meth:`suspect` one; None if none may."""
        busy = any(self.suspect(index) for index in holding)
        for k, (index, seed) in enumerate(waiting):
            if not (busy and self.suspect(index)):
                del waiting[k]
                return index, seed
        return None

    def died(self, number: int, pid: int | None, how: str, when: str) -> None:
        """Worker ``number`` (process ``pid``) died ``how`` (a signal, an exit code) ``when``."""
        self.deaths.append({"worker": number, "pid": pid, "how": how, "when": when})

    def keep(self, number: int, pid: int | None, how: str, index: int, shard: str) -> None:
        """Episode ``index`` was in dead worker ``number``'s shard, whole: named from there."""
        note = f"written whole by env worker {number} (pid {pid}) before it died ({how}); kept"
        self.kept.append({"index": index, "shard": shard, "note": note})

    def lose(self, number: int, pid: int | None, how: str, lost: list[tuple[tuple[int, int], str]]) -> list:
        """Episodes dead worker ``number`` had (``((index, seed), what happened)``) end ``worker_lost``; returns those to
        run again (``(index, seed)``, in the order given), the others given up (:attr:`failed`)."""
        again = []
        for (index, seed), what in lost:
            why = f"env worker {number} (pid {pid}) {what} ({how})"
            self.lost.append(EpisodeEnd(index, seed, "worker_lost", False, 0, 0, error=why, dropped=True))
            self.tries[index] = self.tries.get(index, 0) + 1
            if self.tries[index] >= MAX_TRIES:
                self.failed[index] = why
            else:
                again.append((index, seed))
        return again

    def restart(self, p, how: str, starting: bool) -> None:
        """Count a restart of worker ``p`` (a :class:`~rollcap.rollout.workers.core.Proc`), or end the run in one line.

        Raises:
            RecordingFailed: ``p`` died :data:`MAX_TRIES` times in a row before it was ready, or the workers more than
                :data:`MAX_TRIES` times each.
        """
        p.start_failures = p.start_failures + 1 if starting else 0
        if p.start_failures >= MAX_TRIES:
            raise RecordingFailed(
                f"env worker {p.number} could not start: it died {p.start_failures} times before it was ready (the last: {how})"
            )
        self.restarts += 1
        if self.restarts > MAX_TRIES * self.workers:
            raise RecordingFailed(f"env workers died {self.restarts} times; the last: worker {p.number} ({how})")

    def summary(self) -> dict:
        """What the run's summary says of them."""
        lost = [{"index": e.index, "stop_reason": e.stop_reason, "error": e.error} for e in self.lost]
        return {
            "worker_restarts": self.restarts,
            "workers_lost": list(self.deaths),
            "lost_and_rerun": lost,
            "kept_from_lost_workers": list(self.kept),
            "failed": {str(k): v for k, v in sorted(self.failed.items())},
        }
