"""The batched episode core: N envs in lockstep over one policy graph and one critic graph at batch N.

```
for each round:   every running slot's host.launch()   (writes its row: observation, its own noise)
                  one replay of the policy graph ‖ one of the critic graph (all N rows at once)
                  every slot's host.decide()            (its row's chunk and value, its own predicates)
                  the slots' host.execute() on a small thread pool (env steps; MuJoCo releases the GIL)
                  finished slots: finish() in slot order, then start the next episode in that slot
```

Each slot is a plain :class:`~rollcap.rollout.host.RolloutHost` whose policy
and critic are *row views* (:class:`RowPolicy`, :class:`RowCritic`) of one
batched :class:`~rollcap.policies.runner.PolicyRunner` /
:class:`~rollcap.critics.runner.CriticRunner`. So every episode keeps its own
seed, host-drawn noise, stop rules and record, exactly as a batch-1 run makes
them; only the replay is shared. A slot whose episode ended starts the next
one at once; at the tail of a run a slot with nothing left to run keeps the
inputs it last held. Rows never mix: a row's bits depend on its own inputs and
the batch size, not on what other rows hold or which row it is (measured and
tested in ``tests/rollout/test_batch.py``), so an idle slot cannot change the
others' bits. A row is *not* the same bits as batch 1 on CPU (the GEMMs pick
other blockings at another batch; ~2.5e-7 apart), so the batch size is in the
fingerprint and replay rebuilds the runners at the recorded batch.

Synchronous chunking only; no teleop (one person drives one episode). The
driver is single-threaded; only ``execute`` runs on the pool, and shared
subscribers are called under one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, Observation, StepEvent, Subscriber
from rollcap.rollout.spec import MAX_ENVS, check_batched_host


class Rows:
    """One batched runner shared by its rows: rows are written, one launch replays them all, one wait.

    ``launch`` replays only if a row was written since the last replay;
    ``wait`` launches first if needed (a row used on its own, as replay does).
    """

    def __init__(self, runner):
        self.runner = runner
        self._dirty = False
        self._inflight = False
        self.host: dict[str, np.ndarray] = {}
        """The last replay's outputs on the host as numpy (one device-to-host copy a replay, not one a row; a row reads ~1 us)."""

    def written(self) -> None:
        self._dirty = True

    def launch(self) -> None:
        if self._dirty:
            self.runner.launch()
            self._dirty, self._inflight = False, True

    def wait(self) -> None:
        self.launch()
        if self._inflight:
            self._inflight = False
            self.host = {k: v.to("cpu").numpy() for k, v in self.runner.wait().items()}

    def settle(self) -> None:
        """Wait out (and discard) a replay in flight."""
        if self._inflight:
            self._inflight = False
            self.runner.drain()


class _RowView:
    """What a row view shares: the batched runner, its row, reset and fingerprint."""

    def __init__(self, rows: Rows, row: int):
        if not 0 <= row < rows.runner.batch:
            raise ValueError(f"row: expected 0..{rows.runner.batch - 1}, got {row}")
        self.rows, self.row, self.runner = rows, row, rows.runner

    def reset(self) -> None:
        """Called at each episode start: wait out a replay an error left in flight."""
        self.rows.settle()

    @property
    def last_latency_s(self) -> float:
        """Seconds the shared replay ran (all rows)."""
        return self.runner.last_latency_s

    def state_fingerprint(self) -> dict:
        """The batched runner's (it names the batch; rows are interchangeable, so not the row)."""
        return self.runner.state_fingerprint()


class RowPolicy(_RowView):
    """A :class:`~rollcap.rollout.protocols.ChunkPolicy` over one row of a batched ``PolicyRunner``."""

    @property
    def chunk_shape(self) -> tuple[int, int]:
        return self.runner.chunk_shape

    @property
    def execute_steps(self) -> int:
        return self.runner.execute_steps

    def start(self, obs: Observation, noise: np.ndarray) -> None:
        """Validate and write this row (the batch is launched by the core, or by :meth:`result`)."""
        self.runner.load_row(self.row, obs, noise)
        self.rows.written()

    def __init__(self, rows: Rows, row: int):
        super().__init__(rows, row)
        if hasattr(self.runner, "row_flow"):  # a stochastic sampler: the host records each chunk's flow
            self.chunk_flow = lambda: self.runner.row_flow(self.row, self.rows.host)

    def result(self) -> np.ndarray:
        self.rows.wait()
        return self.rows.host["actions"][self.row].copy()


class RowCritic(_RowView):
    """A :class:`~rollcap.rollout.protocols.ChunkCritic` over one row of a batched ``CriticRunner``."""

    def start(self, obs: Observation) -> None:
        self.runner.load_row(self.row, obs)
        self.rows.written()

    def result(self) -> float:
        self.rows.wait()
        return float(self.rows.host["value"][self.row])


def recorded_batch(fingerprints: dict) -> int:
    """The batch an episode's policy ran at (1 when its fingerprint names none); ValueError for a bad value."""
    batch = (fingerprints.get("policy") or {}).get("batch", 1)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_ENVS:
        raise ValueError(f"the policy fingerprint's batch: expected an int in 1..{MAX_ENVS}, got {batch!r}")
    return batch


def row_views(policy, critic=None, row: int = 0) -> tuple[RowPolicy, RowCritic | None]:
    """Row ``row`` of a batched policy (and critic) on its own: what replay uses for a batched recording."""
    return RowPolicy(Rows(policy), row), None if critic is None else RowCritic(Rows(critic), row)


class _Serialized(Subscriber):
    """A shared subscriber behind one lock: slots' hosts call it from the pool's threads."""

    def __init__(self, inner: Subscriber, lock: threading.Lock):
        self.inner, self.lock = inner, lock
        self.wants_records = getattr(inner, "wants_records", False)

    def on_episode_start(self, start) -> None:
        with self.lock:
            self.inner.on_episode_start(start)

    def on_chunk(self, chunk) -> None:
        with self.lock:
            self.inner.on_chunk(chunk)

    def on_step(self, step) -> None:
        with self.lock:
            self.inner.on_step(step)

    def on_episode_end(self, end) -> None:
        with self.lock:
            self.inner.on_episode_end(end)

    def on_run_end(self) -> None:
        pass  # once per run, by the core (not once per slot)


class BatchedCore:
    """N episode hosts over batched policy and critic graphs (see the module docstring).

    Args:
        envs: N gymnasium envs (one per slot; the same id and kwargs).
        policy: a ``PolicyRunner`` captured at batch N, or G of them at batch N/G
            each on its own lane (*graphs*: slot ``i`` is row ``i % (N/G)`` of
            graph ``i // (N/G)``; on CPU the G replays run side by side, one core each).
        critic: a ``CriticRunner`` at the policy's batch (G of them with G policies), or None.
        config: the hosts' config (synchronous chunking, no control period).
        subscribers: shared by every slot (called under one lock, ``on_run_end`` once).
        records: as :class:`RolloutHost`'s.
        on_error: as :class:`RolloutHost`'s.
        workers: threads that step the envs (0: the driver's thread; default min(N, 4)).

    Single-threaded driver: call :meth:`episodes` / :meth:`run` from one thread.
    """

    def __init__(
        self,
        envs: Sequence,
        policy,
        critic=None,
        config: HostConfig | None = None,
        subscribers: Sequence[Subscriber] = (),
        records: bool = True,
        on_error: str = "record",
        workers: int | None = None,
    ):
        config = config or HostConfig()
        n = len(envs)
        policies = list(policy) if isinstance(policy, (list, tuple)) else [policy]
        critics = (
            list(critic)
            if isinstance(critic, (list, tuple))
            else [critic] * len(policies)
            if critic is None
            else [critic]
        )
        batch = getattr(policies[0], "batch", None)
        if (
            len(critics) != len(policies)
            or any(getattr(r, "batch", None) != batch for r in policies + [c for c in critics if c is not None])
            or batch * len(policies) != n
        ):
            got = (
                [getattr(r, "batch", None) for r in policies],
                [getattr(c, "batch", None) for c in critics if c is not None],
            )
            raise ConfigError(
                "envs",
                f"{n} envs need policy (and critic) graphs whose batches add up to {n}, all of one batch; got batches {got[0]} and {got[1]}",
            )
        check_batched_host(config)
        self.policy_rows = [Rows(r) for r in policies]
        self.critic_rows = [Rows(c) for c in critics if c is not None]
        self.lock = threading.Lock()
        self.subscribers = list(subscribers)
        shared = [_Serialized(s, self.lock) for s in self.subscribers]

        def host(i: int, env) -> RolloutHost:
            g, row = divmod(i, batch)
            return RolloutHost(
                env,
                RowPolicy(self.policy_rows[g], row),
                RowCritic(self.critic_rows[g], row) if self.critic_rows else None,
                config,
                shared,
                records=records,
                on_error=on_error,
            )

        self.hosts = [host(i, env) for i, env in enumerate(envs)]
        self.workers = min(n, 4) if workers is None else int(workers)
        self._pool: ThreadPoolExecutor | None = None
        self.config, self.policy, self.critic = (
            self.hosts[0].config,
            self.hosts[0].policy,
            self.hosts[0].critic,
        )  # as a host's (resume's checks)

    def run(self, episodes: int, start: int = 0) -> list[EpisodeEnd]:
        """Episodes ``start .. start+episodes-1``, in the order they end; ``on_run_end`` is called however it ends."""
        try:
            return list(self.episodes(range(start, start + episodes)))
        finally:
            for s in self.subscribers:
                s.on_run_end()

    def episodes(self, todo: Iterable[int | tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Run the episodes ``todo`` names (an index, or ``(index, seed)``), each in the next free slot; yield each one's end as it finishes."""
        todo = iter(todo)
        self.open_pool()
        try:
            yield from self._refill(todo)
            while any(h.state is HostState.RUNNING for h in self.hosts):
                self._round()
                yield from self._refill(todo)
        except BaseException:
            self.abort()
            raise
        finally:
            self.close_pool()

    def open_pool(self) -> None:
        """Start the env-stepping threads (:meth:`episodes` does; a caller of :meth:`round` may)."""
        if self._pool is None and self.workers > 0:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rollcap-env")

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _round(self) -> None:
        self.round()

    def round(
        self,
        noise: Sequence[np.ndarray | None] | None = None,
        actions: Sequence[np.ndarray | None] | None = None,
        active: Sequence[bool] | None = None,
    ) -> list[tuple[ChunkEvent | None, list[StepEvent]]]:
        """One boundary for every running slot: launch all, one replay per graph, decide all, execute all on the pool.

        Args:
            noise: per slot, the noise for ``launch`` (None: the episode's own).
            actions: per slot, the chunk ``execute`` runs (None: the policy's).
            active: per slot, whether it takes part (default: every running slot).

        Returns per slot its chunk event (None: it did not take part, or its
        episode ended at the boundary) and its steps' events. A slot whose
        episode ended stays stopped: :meth:`RolloutHost.finish` it.
        """
        n = len(self.hosts)
        noise, actions, active = noise or [None] * n, actions or [None] * n, active or [True] * n
        out: list[tuple[ChunkEvent | None, list[StepEvent]]] = [(None, []) for _ in range(n)]
        launched = [
            (i, h, h.launch(noise[i])) for i, h in enumerate(self.hosts) if active[i] and h.state is HostState.RUNNING
        ]
        for rows in self.policy_rows + self.critic_rows:  # every graph's lane at once
            rows.launch()
        for i, h, ticket in launched:  # while the batch replays: each slot's next noise
            if ticket is not None:
                h.draw_ahead()
        for i, h, ticket in launched:
            if ticket is not None:
                out[i] = (h.decide(ticket), [])
        ready = [i for i, h, _ in launched if self.hosts[i].state is HostState.RUNNING]
        if self._pool is None or len(ready) < 2:
            for i in ready:
                out[i] = (out[i][0], self.hosts[i].execute(actions[i]))
            return out
        futures = {i: self._pool.submit(self.hosts[i].execute, actions[i]) for i in ready}
        try:
            for i, f in futures.items():
                out[i] = (out[i][0], f.result())
        finally:
            for f in futures.values():  # an interrupt in the driver still waits for every env step in flight
                f.exception() if not f.cancel() else None
        return out

    def _refill(self, todo: Iterator[int | tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Finish the slots whose episode ended (slot order) and start the next episode in each free slot
        (an item is an episode index, its seed derived from the run's, or ``(index, seed)``)."""
        for h in self.hosts:
            while h.state is not HostState.RUNNING:
                if h.state is HostState.STOP_INFER:
                    yield h.finish()
                    continue
                item = next(todo, None)
                if item is None:
                    break
                h.start(*item) if isinstance(item, tuple) else h.start(item)

    def abort(self) -> None:
        """Abandon every running episode (nothing recorded); the core is ready again."""
        for h in self.hosts:
            h.abort()

    def close(self) -> None:
        """Abandon any running episode and close the envs (the batched runners are the caller's)."""
        self.close_pool()
        for h in self.hosts:
            h.close()  # the row views have no close(): the batched runners stay open
