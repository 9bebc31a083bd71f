"""The parent's side of one env worker process, the rows' round trip through the runners, the episodes' events here.

Imports point downward: ``protocols``; the worker's module by name (the spawn target).
"""

from __future__ import annotations

import json
import signal
import time

import numpy as np

from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, EpisodeStart


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
