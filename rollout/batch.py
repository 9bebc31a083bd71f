"""The batched round: what a synchronous run does at every chunk boundary of its slots, written once.

```
launch    every running slot's host.launch()              its inputs checked (a row of the batch): observation, noise
replay    every graph once, policy ‖ critic               by whoever owns the graphs (this process, an env worker's parent)
          (in this process the rows are copied in first, one copy an input)
decide    every launched slot draws its next noise, then  host.decide(): its chunk and value, its own stop predicates
execute   every slot still running: host.execute()        the chunk's env steps (on a few threads when the round has them)
finish    every ended slot, in slot order: host.finish()  its EpisodeEnd; the slot takes the next episode
```

A *slot* is one env and the :class:`~rollcap.rollout.host.RolloutHost` around
it. :class:`Round` is those phases over some slots; where the slots live is a
*placement*, and each runs this same round: this process (:class:`BatchedCore`
at batch N over *row views* of batched runners; at batch 1 a :class:`Round` of
one slot over plain runners, whose ``launch`` starts the lanes itself: no replay
step), env worker processes (:mod:`rollcap.rollout.workers.child`: the parent
replays the graphs between a worker's launch and its decide) or Ray actors
(:mod:`rollcap.rollout.ray.episodes`: a round in process on the actor).
:meth:`Round.round` runs the phases in order around the placement's replay; a
worker, whose replay is its parent's answer to a message, calls
:meth:`~Round.launch`, then :meth:`~Round.decide`, :meth:`~Round.execute` and
:meth:`~Round.finish` as the messages come.

In :class:`BatchedCore` each slot's policy and critic are row views
(:class:`RowPolicy`, :class:`RowCritic`) of one batched
:class:`~rollcap.policies.runner.PolicyRunner` /
:class:`~rollcap.critics.runner.CriticRunner`. So every episode keeps its own
seed, host-drawn noise, stop rules and record, exactly as a batch-1 run makes
them; only the replay is shared. A slot whose episode ended starts the next
one at once; at the tail of a run a slot with nothing left to run keeps the
inputs it last held. Rows never mix: a row's bits depend on its own inputs and
the batch size, not on what other rows hold or which row it is (measured and
tested in ``tests/rollout/test_batch.py``), so an idle slot, the slot an
episode ran in and where the slot lived cannot change an episode's bits. A row
is *not* the same bits as batch 1 on CPU (the GEMMs pick other blockings at
another batch; ~2.5e-7 apart), so the batch size is in the fingerprint and
replay rebuilds the runners at the recorded batch.

At batch N > 1: synchronous chunking only, no teleop (one person drives one
episode). The driver is single-threaded; only ``execute`` runs on the round's
threads (MuJoCo releases the GIL), and the subscribers a batched core's slots
share are called under one lock.

Imports point downward: ``config``, ``errors``, ``host``, ``lifecycle``, ``protocols`` (no torch: env workers import it).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rollcap.kernels.errors import BadInput
from rollcap.kernels.finite import all_finite
from rollcap.policies.observation import ObsHandoff, noise_input
from rollcap.rollout.config import MAX_ENVS, HostConfig, check_batched_host
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.lifecycle import HostState, Launched
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, Observation, StepEvent, Subscriber


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

    def execute(
        self, actions: Sequence | Mapping | None = None, slots: Sequence[int] | None = None
    ) -> dict[int, list[StepEvent]]:
        """Every slot that decided and still runs (or ``slots``: these, whose last boundary decided) executes its
        chunk (``actions[slot]``: another chunk, None: the policy's), on the round's threads when it has them;
        returns each slot's step events."""
        ready, self._decided = (self._decided if slots is None else list(slots)), []
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
        events = self.boundaries(noise, active)
        steps = self.execute(actions)
        return [(event, steps.get(s, [])) for s, event in zip(self.slots, events)]

    def boundaries(self, noise: Sequence | Mapping | None = None, active: Sequence | Mapping | None = None) -> list:
        """:meth:`round`'s first half: launch, the placement's replay, decide; per slot, in slot order, its chunk
        event (None: it did not take part, or its episode ended instead). :meth:`execute` is the second half."""
        self.launch(noise, active)
        if self.replay is not None:
            self.replay()
        events = self.decide()
        return [events.get(s) for s in self.slots]

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


class Rows:
    """One batched runner shared by its rows: rows are written, one launch replays them all, one wait.

    A row view hands its checked inputs over (:meth:`write`); ``launch`` copies every row handed over since the last
    replay into the runner's buffers at once (one copy an input when every row was), then replays, only if a row was
    written; ``wait`` launches first if needed (a row used on its own, as replay does).

    The NaN / Inf check of the rows' float inputs (the observation's state, the noise) is made here, once a launch
    over the whole buffer just filled, not once a row (``checks_finite``; issue 57): a written row that holds one is
    in :attr:`failed`, and its row view's result raises the :class:`~rollcap.kernels.errors.BadInput` that
    ``load_row`` would have raised (the same message), so its episode ends with an error before any action of the
    chunk, as it would at the launch. The row still replays, which cannot change another row's bits (rows never mix).

    ``same_inputs_as``: the rows of another runner at the same batch, launched first, whose rows carry the
    observation's arrays this runner reads too (a slot's policy row hands the arrays it checked to the slot's critic
    row: :class:`~rollcap.policies.observation.ObsHandoff`). When every row of this launch is, dict for dict, the
    ``part`` that runner's last launch copied in with every row, its buffers already hold these inputs in one piece,
    and they are copied from there (one contiguous copy an input) instead of gathered from the rows again (issue 57).
    Anything else (a row checked on its own, a row missing) is gathered from the rows as usual.
    """

    def __init__(self, runner, same_inputs_as: Rows | None = None):
        self.runner = runner
        self.same_inputs_as = same_inputs_as
        self._rows: list[dict[str, np.ndarray] | None] = [None] * runner.batch
        self._parts: list[dict[str, np.ndarray] | None] = [None] * runner.batch
        self._copied_parts: list[dict[str, np.ndarray] | None] | None = None
        """The rows' ``part`` dicts the last launch copied in, when it copied in every row (None otherwise)."""
        self._written = False
        self._inflight = False
        self.outputs: dict[str, np.ndarray] = {}
        """The last replay's outputs on the host as numpy (one device-to-host copy a replay, not one a row; a row reads ~1 us)."""
        inputs = runner.inputs
        host = {name: inputs.host(name) for name in inputs.names}
        self._floats = tuple(name for name, a in host.items() if a is not None and a.dtype.kind == "f")
        self.checks_finite = all(a is not None for a in host.values())
        """Whether :meth:`launch` checks the float inputs (every input has a host view: not so for a dtype numpy lacks,
        whose rows the row views check one by one)."""
        self.failed: dict[int, str] = {}
        """The last launch's written rows whose float inputs hold a NaN or Inf: row -> the error's message."""
        self.actions_finite: bool | None = None
        """True when every row of the last replay's ``actions`` output is finite (one check a replay, for the rows'
        :attr:`RowPolicy.chunk_finite`); None: not known (no such output, or a row holds a NaN or Inf)."""

    def write(self, row: int, values: dict[str, np.ndarray], part: dict[str, np.ndarray] | None = None) -> None:
        """Row ``row``'s checked batch-1 inputs, copied in at the next launch (a row written twice: the last values).

        ``part``: a dict whose arrays ``values`` holds under the same names (the observation's part of a policy row),
        which another runner's row may be handed whole (see ``same_inputs_as``); never changed afterwards."""
        self._rows[row], self._parts[row], self._written = values, part, True

    def launch(self) -> None:
        if self._written:
            rows, self._rows, self._written = self._rows, [None] * len(self._rows), False
            parts, self._parts = self._parts, [None] * len(self._parts)
            shared = self._shared_inputs(rows)
            if shared is not None:
                self.runner.write(shared)
            else:
                self.runner.write_rows(rows)
            self._copied_parts = parts if None not in rows else None
            self.failed = self._nonfinite(rows) if self.checks_finite else {}
            self.runner.launch()
            self._inflight = True

    def _nonfinite(self, rows: list[dict[str, np.ndarray] | None]) -> dict[int, str]:
        """The written rows whose float inputs, as the buffers now hold them, have a NaN or Inf: one check a buffer, row
        by row only when it finds one (a row not written this launch is not this launch's)."""
        failed: dict[int, str] = {}
        inputs = self.runner.inputs
        for name in self._floats:
            buf = inputs.host(name)
            if all_finite(buf):
                continue
            what = "noise" if name == "noise" else f"observation[{name!r}]"  # load_row's words
            for i, values in enumerate(rows):
                if values is not None and name in values and i not in failed and not all_finite(buf[i]):
                    failed[i] = f"{what}: contains NaN or Inf"
        return failed

    def wait_row(self, row: int) -> None:
        """:meth:`wait`, then raise the :class:`~rollcap.kernels.errors.BadInput` of row ``row`` if the launch found a
        NaN or Inf in it (its outputs are not its chunk's)."""
        self.wait()
        if row in self.failed:
            raise BadInput(self.failed[row])

    def _shared_inputs(self, rows: list[dict[str, np.ndarray] | None]) -> dict[str, np.ndarray] | None:
        """``same_inputs_as``'s host buffers by name, when they hold exactly what ``rows`` would be copied in as: its
        last launch copied in every row, and each of ``rows`` is that row's ``part`` itself (identity: its arrays are
        the ones those buffers were filled from, under the same names). Else None: gather ``rows``."""
        source = self.same_inputs_as
        theirs = None if source is None else source._copied_parts
        if theirs is None or len(theirs) != len(rows) or not all(map(operator.is_, rows, theirs)):
            return None
        inputs = source.runner.inputs
        shared = {name: inputs.host(name) for name in rows[0]}
        return None if any(a is None for a in shared.values()) else shared  # None: a dtype numpy lacks

    def wait(self) -> None:
        if self._written:
            self.launch()
        if self._inflight:
            self._inflight = False
            self.outputs = outputs = {k: v.to("cpu").numpy() for k, v in self.runner.wait().items()}
            self.actions_finite = True if "actions" in outputs and all_finite(outputs["actions"]) else None

    def settle(self) -> None:
        """Wait out (and discard) a replay in flight."""
        if self._inflight:
            self._inflight = False
            self.runner.drain()


class _RowView:
    """What a row view shares: the batched runner, its row, reset and fingerprint; ``handoff``: the slot's
    observation check, which its critic row takes from its policy row (checked once a launch)."""

    def __init__(self, rows: Rows, row: int, handoff: ObsHandoff | None = None):
        if not 0 <= row < rows.runner.batch:
            raise ValueError(f"row: expected 0..{rows.runner.batch - 1}, got {row}")
        self.rows, self.row, self.runner = rows, row, rows.runner
        self.handoff = handoff or ObsHandoff()
        self._spec, self._obs_inputs = self.runner.obs_spec, self.runner.obs_inputs  # fixed for the runner's life

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

    chunk_finite: bool | None = None
    """After :meth:`result`: True when the batch's whole chunk output was finite (checked once a replay, so the host's
    :class:`~rollcap.rollout.predicates.NonFiniteAction` need not check the row again); None: not known."""

    @property
    def chunk_shape(self) -> tuple[int, int]:
        return self.runner.chunk_shape

    @property
    def execute_steps(self) -> int:
        return self.runner.execute_steps

    def __init__(self, rows: Rows, row: int, handoff: ObsHandoff | None = None):
        super().__init__(rows, row, handoff)
        self._chunk_shape = tuple(self.runner.chunk_shape)
        self._finite = not rows.checks_finite  # check NaN / Inf here only where the rows' launch cannot
        if hasattr(self.runner, "row_flow"):  # a stochastic sampler: the host records each chunk's flow
            self.chunk_flow = lambda: self.runner.row_flow(self.row, self.rows.outputs)

    def start(self, obs: Observation, noise: np.ndarray) -> None:
        """Validate this row's inputs, as the runner's ``load_row`` does, and hand them to the rows (written and launched
        with the batch by the core, or by :meth:`result`); the checked observation waits in the handoff for this slot's
        critic. A NaN or Inf is found by the rows' launch, for the whole batch at once, and raised by :meth:`result`."""
        values = self._obs_inputs(obs, self._finite)
        self.handoff.put(obs, self._spec, values)
        self.rows.write(self.row, {**values, "noise": noise_input(noise, self._chunk_shape, self._finite)}, part=values)

    def result(self) -> np.ndarray:
        rows = self.rows
        rows.wait_row(self.row)
        self.chunk_finite = rows.actions_finite
        return rows.outputs["actions"][self.row].copy()


class RowCritic(_RowView):
    """A :class:`~rollcap.rollout.protocols.ChunkCritic` over one row of a batched ``CriticRunner``."""

    def start(self, obs: Observation) -> None:
        """This row's inputs, to the rows: the observation the slot's policy row just checked (same spec), else checked
        here (NaN / Inf included: a refusal now, as ``load_row``'s; the handed-over arrays' are the rows' launch's)."""
        values = self.handoff.take(obs, self._spec)
        self.rows.write(self.row, self._obs_inputs(obs) if values is None else values)

    def result(self) -> float:
        rows = self.rows
        rows.wait_row(self.row)
        return float(rows.outputs["value"][self.row])


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


class BatchedCore(Round):
    """N episode hosts over batched policy and critic graphs: the :class:`Round` in this process.

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
        policies, critics = graphs_of(policy, critic)
        batch = getattr(policies[0], "batch", None)
        if (
            (critics and len(critics) != len(policies))
            or any(getattr(r, "batch", None) != batch for r in policies + critics)
            or batch * len(policies) != n
        ):
            got = [getattr(r, "batch", None) for r in policies], [getattr(c, "batch", None) for c in critics]
            raise ConfigError(
                "envs",
                f"{n} envs need policy (and critic) graphs whose batches add up to {n}, all of one batch; got batches {got[0]} and {got[1]}",
            )
        check_batched_host(config)
        self.policy_rows = [Rows(r) for r in policies]
        self.critic_rows = [Rows(c, same_inputs_as=p) for c, p in zip(critics, self.policy_rows)]
        self.lock = threading.Lock()
        self.subscribers = list(subscribers)
        shared = [_Serialized(s, self.lock) for s in self.subscribers]

        def host(i: int, env) -> RolloutHost:
            g, row = divmod(i, batch)
            handoff = ObsHandoff()  # the slot's: its policy row checks an observation, its critic row reads it
            return RolloutHost(
                env,
                RowPolicy(self.policy_rows[g], row, handoff),
                RowCritic(self.critic_rows[g], row, handoff) if self.critic_rows else None,
                config,
                shared,
                records=records,
                on_error=on_error,
            )

        self.hosts = [host(i, env) for i, env in enumerate(envs)]
        super().__init__(self.hosts, self.replay_graphs, min(n, 4) if workers is None else int(workers))
        self.config, self.policy, self.critic = (
            self.hosts[0].config,
            self.hosts[0].policy,
            self.hosts[0].critic,
        )  # as a host's (resume's checks)

    def replay_graphs(self) -> None:
        """The round's replay: every graph with a row written, policy and critic, all lanes at once (the rows wait)."""
        for rows in self.policy_rows + self.critic_rows:
            rows.launch()

    def run(self, episodes: int, start: int = 0) -> list[EpisodeEnd]:
        """Episodes ``start .. start+episodes-1``, in the order they end; ``on_run_end`` is called however it ends."""
        try:
            return list(self.episodes(range(start, start + episodes)))
        finally:
            for s in self.subscribers:
                s.on_run_end()


def graphs_of(policy, critic) -> tuple[list, list]:
    """A runner, or a list of G (one per graph), as lists: ``(policies, critics)``; no critic: an empty list."""
    policies = list(policy) if isinstance(policy, (list, tuple)) else [policy]
    critics = [] if critic is None else list(critic) if isinstance(critic, (list, tuple)) else [critic]
    return policies, [c for c in critics if c is not None]


def round_here(envs: Sequence, policies: Sequence, critics: Sequence, config: HostConfig, subscribers=()) -> Round:
    """The round in this process over a build's envs and runners (:class:`~rollcap.rollout.build.Built`'s lists):
    one slot over the plain runners for one env (any chunking, a policy object of yours), a :class:`BatchedCore`
    over row views of batched runners for N envs."""
    if len(envs) == 1:
        return Round([RolloutHost(envs[0], policies[0], critics[0] if critics else None, config, subscribers)])
    return BatchedCore(envs, list(policies), list(critics), config, subscribers)
