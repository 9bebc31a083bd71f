"""EnvWorkers: the N envs of a batched run in W worker processes; this process owns the batched graphs.

```
each round:  every worker: its slots launch (rows written into the shared block)  -> "launched"
             this process: the block's rows -> the runners' static inputs (one copy per input and graph),
                           one replay of the policy ‖ one of the critic per graph, the outputs -> the block
             every worker: "go": decide, execute the whole chunk (every step's data stays there),
                           finish and record the ended episodes in its shard  -> ends, free slots
             this process: names each recorded episode in the manifest, hands out the next (index, seed) items
```

It offers :class:`~rollcap.rollout.batch.BatchedCore`'s interface: :meth:`episodes`
over ``(index, seed)`` items (or indices) yields each :class:`EpisodeEnd` as it
ends (outcomes: the record is in the worker's shard), :meth:`abort`,
:meth:`close`. An episode's bytes are those of the same episode in an
in-process ``BatchedCore`` at the same batch (and graphs): a worker's hosts are
plain :class:`~rollcap.rollout.host.RolloutHost` s over row views
(:mod:`~rollcap.rollout.workers.proxy`) that write the bytes ``load_row`` writes,
and a row's outputs depend on its own inputs and the batch only
(``tests/rollout/test_batch.py``), so which slot, which worker and how many
workers cannot change them.

Recording (:meth:`record_to`): each worker writes its episodes to its own shard
(``shards/wNNN`` of a sharded run, :mod:`~rollcap.rollout.recording.shards`), and
this process appends one manifest line per episode once the worker says it is
written (the commit point), so the run reads as one run (replay, inspect,
merge, resume) and only outcomes cross back.

With G graphs and W a multiple of G, each graph's slots live on W/G workers of their own and a graph's round runs as
soon as its workers have launched: one graph replays while the others' envs step (a pipeline; the bytes are those of
the same graphs in process). Otherwise every round waits for every worker.

Faults: a worker that dies at any moment is replaced, its written episodes kept and the others run again
(:mod:`~rollcap.rollout.workers.losses`). An env exception ends one episode (stop reason ``error``), as in process.

The caller's subscribers see each episode's start (no observation), each
chunk's step, critic value and timings (no observation, noise or chunk: those
stay in the worker and its shard) and its end.

:class:`Proc` is the parent's side of one worker process (spawned with its JSON setup, replaced when it dies);
:class:`EnvWorkersPlacement` is the run's placement of a batched run's envs in workers (``rollcap run --envs N
--env-workers W``): the graphs run here at the run's batch (what :func:`~rollcap.rollout.build.build` captured),
each episode named in the run's manifest once its worker has written it.

Imports point downward: ``batch`` (its checks), ``config``, ``placement``, ``protocols``,
``seeding``, the block; the worker's module by name (the spawn target).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import wait as wait_any

import numpy as np

from rollcap.rollout.batch import graphs_of
from rollcap.rollout.config import HostConfig, check_batched_host
from rollcap.rollout.errors import ConfigError, RecordingFailed
from rollcap.rollout.lifecycle import jsonable
from rollcap.rollout.placement import Placement
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, EpisodeStart, Subscriber
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.workers.losses import Losses
from rollcap.rollout.workers.child import outcome
from rollcap.rollout.workers.shm import SharedRows, layout_for


class Proc:
    """One worker process as this process sees it."""

    def __init__(self, number: int, slots: list[int]):
        self.number, self.slots = number, slots
        self.proc = self.conn = None
        self.pid: int | None = None
        self.state = "down"  # starting -> recording -> idle / launching / launched; down
        self.running: dict[int, tuple[int, int]] = {}  # slot -> (index, seed)
        self.pending: dict[int, tuple[int, int]] = {}  # index -> (index, seed): finished, not yet written
        self.launched: list[int] = []
        self.shard: str | None = None
        self.t_start = 0.0
        self.start: dict = {}
        """What its last start cost: ``start_s`` (spawn to ready), and the worker's own ``rss_mb``, ``modules``, ``torch``."""
        self.start_failures = 0  # deaths in a row before it was ready

    @property
    def free(self) -> list[int]:
        return [s for s in self.slots if s not in self.running]

    def send(self, msg: dict) -> None:
        self.conn.send_bytes(json.dumps(msg).encode())

    def receive(self) -> dict:
        """The worker's next message (blocks); its "ready" sets :attr:`start`."""
        msg = json.loads(self.conn.recv_bytes())
        if "ready" in msg:
            self.start = {"start_s": time.perf_counter() - self.t_start, **msg.get("start", {})}
        return msg

    def spawn(self, ctx, setup: str) -> None:
        """Start the worker process (a spawn context: the parent has threads) with its JSON ``setup``."""
        from rollcap.rollout.workers.child import serve

        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=serve, args=(child, setup), name=f"rollcap-env-{self.number}", daemon=True)
        self.proc.start()
        child.close()
        self.state, self.pid, self.t_start, self.launched = "starting", self.proc.pid, time.perf_counter(), []

    def stop(self, timing: dict) -> list[dict]:
        """Ask the worker to stop (it abandons what runs, writes what finished) and wait; returns the ends it wrote last
        (an end lost on the way, in a reply not read, leaves an orphan of its shard: readers ignore it, a resume adopts it)."""
        ends: list[dict] = []
        if self.proc is None or self.state == "down":
            return ends
        asked, self.state = self.state not in ("starting", "recording"), "stopping"
        if asked:
            self.try_send({"stop": 1})
            deadline = time.perf_counter() + 30  # it writes what finished first
            try:
                while self.conn.poll(max(0.0, deadline - time.perf_counter())):
                    msg = json.loads(self.conn.recv_bytes())
                    ends += msg.get("ends", [])
                    if "bye" in msg:
                        for k, v in msg["bye"].items():
                            timing[k] = timing.get(k, 0.0) + v
                        break
            except (EOFError, OSError, ValueError):
                pass
        self.proc.join(timeout=10 if asked else 0)  # a worker still starting has nothing to keep
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        self.state, self.running, self.pending, self.launched = "down", {}, {}, []
        return ends

    def reap(self) -> tuple[str, bool, list, list]:
        """The process is gone (its pipe closed): wait for it (kill it if it lingers, so nothing writes its shard any
        more) and forget its episodes. Returns how it died, whether it was still starting, and the ``(index, seed)`` of
        the episodes it was running and of those it had finished, not yet written (its state is then ``down``)."""
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        code = self.proc.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        out = how, self.state in ("starting", "recording"), sorted(self.running.values()), sorted(self.pending.values())
        self.running, self.pending, self.launched = {}, {}, []
        self.conn.close()
        self.state = "down"
        return out

    def try_send(self, msg: dict) -> None:
        """:meth:`send`, unless the worker is gone (the caller finds its end)."""
        try:
            self.send(msg)
        except OSError:
            pass


def split_slots(n: int, batch: int, graphs: int, workers: int) -> tuple[list[list[int]], list[list[int]]]:
    """The slots of each of ``workers`` (contiguous) and the groups of workers whose rounds run together: with G graphs
    and W a multiple of G, each graph's slots on W/G workers of their own (a graph's round runs beside the others');
    else one group."""
    g, b = graphs, batch
    if g > 1 and workers % g == 0:
        parts = [part for k in range(g) for part in np.array_split(np.arange(k * b, (k + 1) * b), workers // g)]
        groups = [list(range(k * (workers // g), (k + 1) * (workers // g))) for k in range(g)]
    else:
        parts, groups = np.array_split(np.arange(n), workers), [list(range(workers))]
    return [[int(s) for s in part] for part in parts], groups


def end_from(e: dict) -> EpisodeEnd:
    """The end an :func:`outcome` describes (no record: it is in the worker's shard)."""
    fields = ("index", "seed", "stop_reason", "success", "steps", "chunks")
    return EpisodeEnd(*(e[k] for k in fields), error=e["error"], dropped=e["dropped"])


def end_of(record) -> EpisodeEnd:
    """The end of an episode read back from its record (one a dead worker had written)."""
    return EpisodeEnd(
        record.index, record.seed, record.stop_reason, bool(record.success), record.num_steps, record.num_chunks,
        error=record.error, record=record,
    )  # fmt: skip


def replay_rows(arrays: dict, batch: int, policies: list, critics: list, launched: list[int]) -> float:
    """The block's rows into each graph that has a launched row, one replay each (all lanes at once), outputs back;
    returns the policy replays' seconds (their lanes' own time: GPU time on CUDA)."""
    a, b, busy = arrays, batch, 0.0
    graphs = sorted({s // b for s in launched})
    for g in graphs:
        rows = slice(g * b, (g + 1) * b)
        for prefix, runner in (("p.", policies[g]), ("c.", critics[g] if critics else None)):
            if runner is not None:
                runner.write({k: a[prefix + k][rows] for k in runner.inputs.names})
                runner.launch()
    for g in graphs:
        rows = slice(g * b, (g + 1) * b)
        out = policies[g].wait()
        np.copyto(a["actions"][rows], out["actions"].to("cpu").numpy())
        a["latency"][rows, 0] = policies[g].last_latency_s
        busy += policies[g].last_latency_s
        if critics:
            out = critics[g].wait()
            np.copyto(a["value"][rows], out["value"].to("cpu").numpy())
            a["latency"][rows, 1] = critics[g].last_latency_s
    return busy


def emit(subscribers, end: EpisodeEnd, e: dict, fields: tuple) -> None:
    """Show ``subscribers`` an episode a worker ran: its start (no observation), its chunks (step, value, timings), its end."""
    start = EpisodeStart(end.index, end.seed, e.get("instruction", ""), None, {}, *fields)
    for s in subscribers:
        s.on_episode_start(start)
    rows = e.get("chunk_rows", [])
    for k, (step, value, lat_p, lat_c, lat_b) in enumerate(rows):
        last = k == len(rows) - 1 and int(step) == end.num_steps and end.stop_reason not in ("error", "caller")
        event = ChunkEvent(
            end.index, k, int(step), None, None, None, value, lat_p, lat_c, lat_b, end.stop_reason if last else None
        )
        for s in subscribers:
            s.on_chunk(event)
    for s in subscribers:
        s.on_episode_end(end)


START_TIMEOUT_S = 300.0
"""A worker that is not ready after this long (spawn, imports, envs) is a failed start."""


class EnvWorkers:
    """N envs (of ``env_id``) in ``workers`` processes over batched runners this process owns (see the module docstring).

    Args:
        env_id, env_kwargs: the envs each worker builds (one per slot).
        policy: a batched ``PolicyRunner`` (or G at batch N/G: slot ``i`` is row ``i % (N/G)`` of graph ``i // (N/G)``),
            or anything with its interface (``batch``, ``inputs``, ``write``, ``launch``, ``wait``, ``chunk_shape``, ...).
        critic: a ``CriticRunner`` at the policy's batch (G of them), or None.
        config: the hosts' config (synchronous chunking, no control period).
        workers: processes; slots are split into contiguous groups, one per worker.
        subscribers: see each episode's start, chunks (timings and value) and end.
        on_error: as :class:`~rollcap.rollout.host.RolloutHost`'s ("raise" is not offered: the episode ends in a worker).
        poll_stop: called while the workers start (raise to stop there).

    Single-threaded: drive it from one thread.
    """

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict | None,
        policy,
        critic=None,
        config: HostConfig | None = None,
        workers: int = 2,
        subscribers: Sequence[Subscriber] = (),
        on_error: str = "record",
        poll_stop=None,
    ):
        config = config or HostConfig()
        check_batched_host(config)
        self.policies, self.critics = graphs_of(policy, critic)
        self.batch = self.policies[0].batch
        self.n = self.batch * len(self.policies)
        if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= self.n:
            raise ConfigError("env_workers", f"expected an integer in 1..envs ({self.n}), got {workers!r}")
        if on_error not in ("record", "drop"):
            raise ValueError(f"on_error: expected record or drop with env workers, got {on_error!r}")
        self.config = config = config.for_policy(self.policies[0])  # as a host resolves it: _same_run, the records
        self.policy, self.critic = self.policies[0], (self.critics[0] if self.critics else None)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.subscribers = list(subscribers)
        self.fingerprints = {"policy": self.policy.state_fingerprint()}
        if self.critic is not None:
            self.fingerprints["critic"] = self.critic.state_fingerprint()
        self.on_error, self.poll_stop = on_error, poll_stop or (lambda: None)
        self._start_fields = (
            self.env_id,
            self.env_kwargs,
            jsonable(dataclasses.asdict(config)),
            self.fingerprints,
            tuple(self.policy.chunk_shape),
        )
        self.shared = SharedRows(layout_for(self.policies, self.critics or None))
        self.arrays = self.shared.arrays
        slots, self.groups = split_slots(self.n, self.batch, len(self.policies), workers)
        self.procs = [Proc(k, part) for k, part in enumerate(slots)]
        self.manifest = self.env_meta = None
        self._shards = 0
        self.losses = Losses(len(self.procs))
        """Worker deaths and what became of their episodes (lost and run again, kept, given up)."""
        self.digests: dict[int, str] = {}
        """Digest of every episode recorded this session, by index."""
        self.timing = {
            "rounds": 0,
            "wait_workers_s": 0.0,
            "replay_s": 0.0,
            "policy_busy_s": 0.0,
            "host_s": 0.0,
            "commit_s": 0.0,
        }
        """Where this process's time goes: waiting for the workers' rows and ends, the replays (and the policy's own share),
        its own work on the messages (``host_s``, the episodes' commits and subscribers included: ``commit_s``)."""
        self._again: deque[tuple[int, int]] = deque()
        self._todo: Iterator | None = None
        self._closing = False
        self.worker_timing: dict[str, float] = {}
        """The workers' own seconds, summed once they stop: ``host_s`` (launch, decide), ``env_s`` (the chunks' steps), ``write_s``."""
        self._ctx = multiprocessing.get_context("spawn")  # this process has threads (lanes): never fork them
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise

    # -- processes -------------------------------------------------------------
    def _setup(self, p: Proc) -> str:
        def obs(r):
            return None if r is None else dataclasses.asdict(r.obs_spec)

        return json.dumps({
            "layout": self.shared.layout.to_json(), "shm": self.shared.name, "slots": p.slots,
            "env_id": self.env_id, "env_kwargs": self.env_kwargs, "config": jsonable(dataclasses.asdict(self.config)),
            "policy_spec": obs(self.policy), "critic_spec": obs(self.critic), "chunk_shape": list(self.policy.chunk_shape),
            "execute_steps": self.config.execute_steps, "fingerprints": {"critic": None, **self.fingerprints},
            "on_error": self.on_error,
        })  # fmt: skip

    def _start_all(self) -> None:
        for p in self.procs:
            if p.state == "down":
                p.spawn(self._ctx, self._setup(p))
        while any(p.state in ("starting", "recording") for p in self.procs):
            self.poll_stop()
            for _ in self._gather(until_idle=True):
                pass

    def record_to(self, manifest, env_meta: dict, subscribers: Sequence[Subscriber] = ()) -> None:
        """Record every episode in the workers' shards of ``manifest``'s run (a ``ManifestWriter``); ``subscribers`` added."""
        self.manifest, self.env_meta = manifest, env_meta
        self.subscribers += list(subscribers)
        names = [n for n in manifest.shard_names() if n[:1] == "w" and n[1:].isdigit()]
        self._shards = max([int(n[1:]) + 1 for n in names], default=0)
        for p in self.procs:
            if p.state == "idle":
                self._record(p)
        self._start_all()

    def _record(self, p: Proc) -> None:
        from rollcap.rollout.recording.shards import SHARDS_DIR

        p.shard, self._shards = f"{SHARDS_DIR}/w{self._shards:03d}", self._shards + 1
        where = str((self.manifest.run_dir / p.shard).resolve())
        p.try_send(  # a worker that died after its "ready": its death is found next (its sentinel)
            {
                "record": {
                    "shard_dir": where,
                    "shard": p.shard,
                    "formats": list(self.manifest.formats),
                    "env_meta": self.env_meta,
                }
            }
        )
        p.state = "recording"

    # -- the run -----------------------------------------------------------------
    def run(self, episodes: int, start: int = 0) -> list[EpisodeEnd]:
        """Episodes ``start .. start+episodes-1`` in the order they end."""
        return list(self.episodes(range(start, start + episodes)))

    def episodes(self, todo: Iterable[int | tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Run the episodes ``todo`` names (an index, or ``(index, seed)``) in the workers' slots; yield each end as it comes back."""
        self._todo = iter(todo)
        try:
            self._start_all()
            self.timing = dict.fromkeys(self.timing, 0)  # the rounds' time, not the workers' start
            for p in self.procs:
                if p.state == "idle":
                    self._give(p)
            while True:
                yield from self._gather()
                ready = [[self.procs[i] for i in grp] for grp in self.groups if self._ready(grp)]
                if not ready:  # every worker idle (or starting): one has work again, or the run is over
                    if any([self._give(p) for p in self.procs if p.state == "idle"]):
                        continue
                    waiting = [p for p in self.procs if p.pending and p.state == "idle"]
                    for p in waiting:  # episodes finished, their records still being written
                        p.state = "launching"
                        p.try_send({"flush": 1})
                    if waiting or any(p.pending for p in self.procs) or self._more():  # _more: workers still starting
                        continue
                    return
                for procs in ready:  # a group's round: its rows replayed, its workers told to go on
                    launched = [s for p in procs if p.state == "launched" for s in p.launched]
                    t0 = time.perf_counter()
                    busy = replay_rows(self.arrays, self.batch, self.policies, self.critics, launched)
                    self.timing["policy_busy_s"] += busy
                    self.timing["replay_s"] += time.perf_counter() - t0
                    self.timing["rounds"] += sum(len(p.slots) for p in procs) / self.n  # whole rounds' worth
                    more = self._more()
                    for p in procs:
                        if p.state == "launched":
                            p.state, p.launched = "launching", []
                            p.try_send({"go": 1, "more": more})
        except BaseException:
            self.abort()
            raise

    def _more(self) -> bool:
        """Whether an episode waits to start (taking it from ``todo`` into the queue)."""
        if self._closing:
            return False
        if not self._again and self._todo is not None:
            item = next(self._todo, None)
            if item is not None:
                self._again.append(self._item(item))
        return bool(self._again)

    def _next_for(self, p: Proc) -> tuple[int, int] | None:
        """The episode a free slot of ``p`` takes: the first that waits, except that a worker runs one lost episode at a
        time (one lost with its worker before), so an episode that kills every worker it runs on takes no other
        episode with it twice, and only it is given up."""
        item = self.losses.pick(self._again, [i for i, _ in [*p.running.values(), *p.pending.values()]])
        if item is not None:
            return item
        if self._closing or self._todo is None:
            return None
        item = next(self._todo, None)
        return None if item is None else self._item(item)

    def _item(self, item) -> tuple[int, int]:
        if isinstance(item, tuple):
            return int(item[0]), int(item[1])
        return int(item), episode_seed(self.config.seed, int(item))

    def _give(self, p: Proc, free: Sequence[int] | None = None) -> bool:
        """Start the next episodes in ``p``'s free slots (all of them if None) and launch its running slots; False: ``p``
        was told nothing (no episode for it, none running)."""
        items = []
        for slot in p.free if free is None else free:
            item = self._next_for(p)
            if item is None:
                break
            p.running[slot] = item
            items.append([slot, *item])
        if items or free is not None or p.running:
            p.state = "launching"
            p.try_send({"start": items})
            return True
        return False

    def _ready(self, group: list[int]) -> bool:
        """Whether a group's round can run: one of its workers has launched rows, none is still mid-chunk."""
        procs = [self.procs[i] for i in group]
        return any(p.state == "launched" for p in procs) and not any(p.state == "launching" for p in procs)

    def _gather(self, until_idle: bool = False) -> Iterator[EpisodeEnd]:
        """Take the workers' messages until a group's round can run or none is mid-round (``until_idle``: until none is
        mid-round or starting); yield the ends."""
        while True:
            busy = [p for p in self.procs if p.state in ("launching", "starting", "recording")]
            holding = busy if until_idle else [p for p in busy if p.state == "launching" or not self._others_busy(p)]
            if not holding or (not until_idle and any(self._ready(g) for g in self.groups)):
                return
            # A worker still starting (a replacement) does not hold a round up, but its messages are taken as they come,
            # so it joins the run as soon as it is ready.
            t0 = time.perf_counter()
            ready = wait_any([p.conn for p in busy] + [p.proc.sentinel for p in busy], timeout=1.0)
            self.timing["wait_workers_s"] += time.perf_counter() - t0
            for p in busy:
                if p.conn in ready or p.proc.sentinel in ready:
                    yield from self._take(p)
                elif p.state == "starting" and time.perf_counter() - p.t_start > START_TIMEOUT_S:
                    p.proc.kill()

    def _others_busy(self, p: Proc) -> bool:
        """Whether a round can go on without ``p`` (starting): another worker runs episodes."""
        return any(q is not p and (q.running or q.state == "launching") for q in self.procs)

    def _take(self, p: Proc) -> Iterator[EpisodeEnd]:
        """Every message ``p`` has sent (or its death)."""
        while True:
            try:
                if not p.conn.poll():
                    if p.proc.is_alive():
                        return
                    raise EOFError
                msg = p.receive()
            except (EOFError, OSError):
                yield from self._died(p)
                return
            t0 = time.perf_counter()
            if "error" in msg:
                what = "could not start" if p.state == "starting" else "failed"
                self._stop(p)
                raise RecordingFailed(f"env worker {p.number} {what}: {msg['error']}")
            if "ready" in msg:
                p.start_failures = 0
            if "ready" in msg and self.manifest is not None:
                self._record(p)
            elif "ready" in msg or "recording" in msg:
                p.state = "idle"
                if self._todo is not None:
                    self._give(p)
            for slot, index in msg.get("finished", ()):  # its slot is free; it is p's until written
                p.pending[index] = p.running.pop(slot)
            if "free" in msg:
                self._give(p, msg["free"])
            elif "launched" in msg:
                p.launched = msg["launched"]
                p.state = "launched" if p.launched else "idle"
            self.timing["host_s"] += time.perf_counter() - t0
            # The ends last: they run the subscribers' code, and an exception there (a Ctrl-C in a callback) must find
            # p's state as its message left it, or an abort waits for a reply p already sent.
            for e in msg.get("ends", ()):
                yield self._end(p, e)

    def _end(self, p: Proc, e: dict) -> EpisodeEnd:
        """An episode a worker finished: named in the manifest (once it is in the shard), shown to the subscribers."""
        t0 = time.perf_counter()
        index = e["index"]
        p.pending.pop(index, None)
        if e.get("digest") is not None:
            self.digests[index] = e["digest"]
            if self.manifest is not None:
                self.manifest.add(index, e["digest"], e["shard"])
        end = end_from(e)
        if self.subscribers:
            emit(self.subscribers, end, e, self._start_fields)
        self.timing["commit_s"] += time.perf_counter() - t0  # the manifest's fsynced line, the subscribers
        return end

    def _died(self, p: Proc) -> Iterator[EpisodeEnd]:
        """``p`` is gone, at whatever moment: an episode it wrote whole is kept (named in the manifest now, and yielded),
        the others it had end (``worker_lost``) and go back to the front of the queue; a replacement starts (a new
        shard), or the run ends (:meth:`Losses.restart`). A worker that *says* why it cannot start ends the run at once
        (``_take``)."""
        stopping = p.state == "stopping"
        how, starting, running, written = p.reap()  # it must be gone before its shard is read
        if stopping:
            return
        self.losses.died(p.number, p.pid, how, "while starting" if starting else "mid-episode" if running else "idle")
        ends = self._salvage(p, how)
        yield from ends
        kept = {e.index for e in ends}
        lost = [(item, "died mid-episode") for item in running if item[0] not in kept]
        lost += [(item, "died before it wrote it") for item in written if item[0] not in kept]
        self._again.extendleft(reversed(self.losses.lose(p.number, p.pid, how, sorted(lost))))
        if not self._closing:
            self.losses.restart(p, how, starting)
            p.spawn(self._ctx, self._setup(p))

    def _salvage(self, p: Proc, how: str) -> list[EpisodeEnd]:
        """The episodes dead ``p`` wrote whole to its shard before the manifest named them, now named (its shard repaired
        as a resume repairs one: a hot journal rolled back, a format it had not reached copied in from the other); they
        are not run again, so no episode is in two shards."""
        if self.manifest is None or p.shard is None:
            return []
        ends = []
        for record in self.manifest.orphans(p.shard):
            self.losses.keep(p.number, p.pid, how, record.index, p.shard)
            ends.append(self._end(p, {**outcome(end_of(record)), "digest": episode_digest(record), "shard": p.shard}))
        return ends

    # -- ending ------------------------------------------------------------------
    def summary(self) -> dict:
        """What the run's summary says of the workers."""
        return {"env_workers": len(self.procs), **self.losses.summary(), "host_timing": dict(self.timing),
                "worker_timing": dict(self.worker_timing), "worker_start": [p.start for p in self.procs]}  # fmt: skip

    def abort(self) -> None:
        """Abandon every running episode: the ends already on their way are taken (named in the manifest), the workers stop
        (the next :meth:`episodes` starts them again).

        A worker mid-chunk is not waited for here: :meth:`Proc.stop` reads its messages (and their ends) up to its
        ``bye``, so a reply read but not acted on (a Ctrl-C between the two) costs nothing. One whose recorder is
        being made answers that first, then is asked to stop."""
        self._closing = True
        for p in self.procs:
            if p.state == "recording":
                deadline = time.perf_counter() + 60
                while p.state == "recording" and time.perf_counter() < deadline:
                    wait_any([p.conn, p.proc.sentinel], timeout=1.0)
                    for _ in self._take(p):
                        pass
            self._stop(p)
        self._again.clear()
        self._closing = False

    def _stop(self, p: Proc) -> None:
        """Stop ``p``; the ends it wrote last are named in the manifest."""
        for e in p.stop(self.worker_timing):
            self._end(p, e)

    def close(self) -> None:
        """Stop the workers (abandoning what runs) and remove the shared block (the runners are the caller's)."""
        self._closing = True
        for p in self.procs:
            self._stop(p)
        self.shared.close()


class EnvWorkersPlacement(Placement):
    """The slots in the workers' processes, the graphs here (see the module docstring)."""

    workers: EnvWorkers | None = None
    _open = False

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """Spawn the workers (``poll_stop`` is called while they start) and have each record into ``shards``."""
        if shards is None:
            raise ValueError("env workers record their episodes in shards of the run: give them its manifest")
        parts, b = self.spec.deployment, self.built
        self.workers = EnvWorkers(
            parts.env_id, parts.env_kwargs, b.policies, b.critics, self.spec.host, self.spec.run.env_workers,
            poll_stop=poll_stop,
        )  # fmt: skip
        self._open = True
        self.workers.record_to(shards, shards.env_meta, subscribers)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        return self.workers.episodes(todo)

    def close(self) -> None:
        """What runs is abandoned (the ends already on their way are named in the manifest); the workers stop."""
        if self._open:
            self._open = False
            self.workers.abort()
            self.workers.close()

    def summary(self) -> dict:
        return {} if self.workers is None else self.workers.summary()
