"""The round: what a synchronous run does at every chunk boundary of its slots, written once.

```
launch    every running slot's host.launch()              its inputs written (a row of the batch): observation, noise
replay    every graph once, policy ‖ critic               by whoever owns the graphs (this process, an env worker's parent)
decide    every launched slot draws its next noise, then  host.decide(): its chunk and value, its own stop predicates
execute   every slot still running: host.execute()        the chunk's env steps (on a few threads when the round has them)
finish    every ended slot, in slot order: host.finish()  its EpisodeEnd; the slot takes the next episode
```

A *slot* is one env and the :class:`~rollcap.rollout.host.RolloutHost` around
it; every episode keeps its own seed, noise, stop rules and record, so an
episode's bytes depend on its own inputs and the batch only, never on its slot
or on where the slot lives. Where the slots live is a *placement*: this process
(:class:`~rollcap.rollout.batch.BatchedCore` at batch N; one slot over plain
runners at batch 1, whose ``launch`` starts the lanes itself: no replay step),
env worker processes (:mod:`rollcap.rollout.workers.child`; the parent replays
the graphs) or Ray actors (:mod:`rollcap.rollout.ray.episodes`, a round in
process on the actor). :meth:`Round.round` runs the phases in order around the
placement's replay; a worker, whose replay is its parent's answer to a message,
calls :meth:`~Round.launch`, then :meth:`~Round.decide`, :meth:`~Round.execute`
and :meth:`~Round.finish` as the messages come.

Single-threaded driver: only ``execute`` runs on the round's threads (MuJoCo
releases the GIL); subscribers the slots share must take that into account
(:class:`~rollcap.rollout.batch.BatchedCore` serialises them).

Imports point downward: ``host``, ``lifecycle``, ``protocols``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from rollcap.rollout.host import RolloutHost
from rollcap.rollout.lifecycle import HostState, Launched
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, StepEvent

Todo = Iterator[int | tuple[int, int]]
"""Episodes to run: an index (its seed derived from the run's) or ``(index, seed)``."""


class Round:
    """The slots ``hosts`` (slot number -> host) and the round they go through (see the module docstring).

    Args:
        hosts: one host per slot, by slot number (a sequence: slots 0, 1, ...).
        replay: the placement's replay of the graphs, called between launch and decide (None: each host's
            ``launch`` started its own lanes, as plain runners at batch 1 do).
        threads: threads that step the slots' envs in ``execute`` (0: the driver's thread).
    """

    def __init__(
        self,
        hosts: Mapping[int, RolloutHost] | Sequence[RolloutHost],
        replay: Callable[[], None] | None = None,
        threads: int = 0,
    ):
        self.slots: dict[int, RolloutHost] = dict(hosts) if isinstance(hosts, Mapping) else dict(enumerate(hosts))
        self.replay = replay
        self.threads = int(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._launched: dict[int, Launched] = {}
        self._decided: list[int] = []

    # -- the phases ------------------------------------------------------------------
    def launch(self, noise: Sequence | Mapping | None = None, active: Sequence | Mapping | None = None) -> list[int]:
        """Launch every running slot (``active[slot]``: whether it takes part; ``noise[slot]``: its noise, None: its
        episode's own); returns the launched slots. A slot whose episode ended instead is left stopped: :meth:`finish`."""
        for s, h in self.slots.items():
            if h.state is HostState.RUNNING and (active is None or active[s]):
                ticket = h.launch(None if noise is None else noise[s])
                if ticket is not None:
                    self._launched[s] = ticket
        return list(self._launched)

    def decide(self) -> dict[int, ChunkEvent | None]:
        """The replay is done or under way: every launched slot draws its next noise (while the graphs run), then
        waits for its chunk and value and asks its predicates; returns each slot's chunk event (None: its episode ended)."""
        launched, self._launched = self._launched, {}
        for s in launched:
            self.slots[s].draw_ahead()
        events = {s: self.slots[s].decide(ticket) for s, ticket in launched.items()}
        self._decided = [s for s in launched if self.slots[s].state is HostState.RUNNING]
        return events

    def execute(self, actions: Sequence | Mapping | None = None) -> dict[int, list[StepEvent]]:
        """Every slot that decided and still runs executes its chunk (``actions[slot]``: another chunk, None: the
        policy's), on the round's threads when it has them; returns each slot's step events."""
        ready, self._decided = self._decided, []
        chunk = (lambda s: None) if actions is None else (lambda s: actions[s])  # noqa: E731
        if self._pool is None or len(ready) < 2:
            return {s: self.slots[s].execute(chunk(s)) for s in ready}
        futures = {s: self._pool.submit(self.slots[s].execute, chunk(s)) for s in ready}
        try:
            return {s: f.result() for s, f in futures.items()}
        finally:
            for f in futures.values():  # an interrupt in the driver still waits for every env step in flight
                f.exception() if not f.cancel() else None

    def finish(self) -> list[tuple[int, EpisodeEnd]]:
        """Finish every ended episode, in slot order; returns ``(slot, end)`` for each (its slot is free)."""
        return [(s, h.finish()) for s, h in self.slots.items() if h.state is HostState.STOP_INFER]

    def round(
        self,
        noise: Sequence | Mapping | None = None,
        actions: Sequence | Mapping | None = None,
        active: Sequence | Mapping | None = None,
    ) -> list[tuple[ChunkEvent | None, list[StepEvent]]]:
        """One boundary of every running slot: launch, the placement's replay, decide, execute (see :meth:`launch`,
        :meth:`execute`). Returns per slot, in slot order, its chunk event (None: it did not take part, or its episode
        ended at the boundary) and its steps' events. A slot whose episode ended stays stopped: :meth:`finish` it."""
        self.launch(noise, active)
        if self.replay is not None:
            self.replay()
        events = self.decide()
        steps = self.execute(actions)
        return [(events.get(s), steps.get(s, [])) for s in self.slots]

    # -- a run of episodes -----------------------------------------------------------
    def episodes(self, todo: Iterable[int | tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Run the episodes ``todo`` names, each in the next free slot; yield each one's end as it finishes.

        However it ends (an exception, a consumer that stops) every running episode is abandoned (not recorded).
        """
        todo = iter(todo)
        self.open_pool()
        try:
            yield from self.refill(todo)
            while any(h.state is HostState.RUNNING for h in self.slots.values()):
                self.round()
                yield from self.refill(todo)
        except BaseException:
            self.abort()
            raise
        finally:
            self.close_pool()

    def refill(self, todo: Todo) -> Iterator[EpisodeEnd]:
        """In slot order: finish the slot's ended episode (yield its end), then start the next of ``todo`` there."""
        for h in self.slots.values():
            while h.state is not HostState.RUNNING:
                if h.state is HostState.STOP_INFER:
                    yield h.finish()
                    continue
                item = next(todo, None)
                if item is None:
                    break
                h.start(*item) if isinstance(item, tuple) else h.start(item)

    # -- threads and the end -----------------------------------------------------------
    def open_pool(self) -> None:
        """Start the env-stepping threads (:meth:`episodes` does; a caller of :meth:`round` may)."""
        if self._pool is None and self.threads > 0 and len(self.slots) > 1:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rollcap-env")

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def abort(self) -> None:
        """Abandon every running episode (nothing recorded); the slots are ready again."""
        self._launched, self._decided = {}, []
        for h in self.slots.values():
            h.abort()

    def close(self) -> None:
        """Abandon any running episode and close the hosts (their runners' lanes and envs)."""
        self.close_pool()
        self._launched, self._decided = {}, []
        for h in self.slots.values():
            h.close()
