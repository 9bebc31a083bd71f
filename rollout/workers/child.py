"""The env worker process: its slots' envs and hosts, stepped a whole chunk at a time, each episode recorded in its shard.

A worker runs the :class:`~rollcap.rollout.host.RolloutHost` of each of its
slots, over :mod:`~rollcap.rollout.workers.proxy` rows in the shared block. It
talks to the parent over one pipe, in JSON messages (never a pickle):

```
parent -> worker                       worker -> parent
{"start": [[slot, index, seed], ...]}  start them, launch every running slot -> {"launched": [slots], ...}
{"go": 1, "more": bool}                the outputs are in the block: decide, execute the chunk, finish the ended (their
                                       records to the writer thread); with free slots and "more": {"free": [slots], ...}
                                       (a "start" follows), else launch the running ones -> {"launched": [slots], ...}
{"flush": 1}                           wait for the writer -> {"launched": [], ...}
{"stop": 1}                            abandon what runs, write what finished, close the shard -> {"bye": timings, ...}
```

Every reply also carries ``finished`` (``[slot, index]`` of the episodes that
ended since the last reply: their slots are free) and ``ends``: the outcomes of
episodes now written (index, seed, stop reason, success, steps, chunks, error,
the digest and shard, and per chunk its step, critic value and timings: what the
parent's metrics and progress read). Every step's data stays here. A writer
thread writes the records (several at once: one HDF5 commit) while the worker
steps its envs and waits for the replay; an end is sent once its episode is on
disk (the parent names it in the manifest, the commit point).

The worker ignores SIGINT (a Ctrl-C reaches the process group; the parent
decides) and imports no torch: its rows are validated with numpy
(:mod:`rollcap.policies.observation`), its capsules hold numpy state and its
records are numpy, so a worker starts with ~70 MB and without torch's ~2 s
(its "ready" says how long, how much, and whether torch came in anyway: an env
of the user's may import it). ``tests/rollout/workers/test_workers.py`` guards this.

Imports point downward: ``build`` (the env), ``host``, ``config``, ``recording``, the block and the proxies.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import sys
import threading
import time
from collections import deque

import numpy as np

from rollcap.policies.observation import ObsSpec
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.batch import Round
from rollcap.rollout.subscribers import take_batch
from rollcap.rollout.workers.proxy import ProxyCritic, ProxyPolicy
from rollcap.rollout.workers.shm import Layout, SharedRows


def serve(conn, setup: str) -> None:
    """The worker's main (a spawn target): build, say ready (or why not), then answer the parent until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = Worker(json.loads(setup))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send_bytes(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
        return
    conn.send_bytes(json.dumps({"ready": os.getpid(), "start": started()}).encode())
    try:
        worker.loop(conn)
    finally:
        worker.close()
    os._exit(0)  # everything is on disk and closed: skip the interpreter's teardown


class Worker:
    """The slots ``setup["slots"]`` of a run: one env and one host each (see the module docstring)."""

    def __init__(self, setup: dict):
        from rollcap.rollout.build import make_env

        self.shared = SharedRows(Layout.from_json(setup["layout"]), setup["shm"])
        self.envs, self.recorder = [], None
        self.writer: ShardWriter | None = None
        self.unrecorded: list[dict] = []  # outcomes of a worker that does not record (tests, benches)
        self.timing = dict.fromkeys(("host_s", "env_s", "write_s", "host_cpu_s", "env_cpu_s", "write_cpu_s"), 0.0)
        self.round = Round({})  # its replay is the parent's: a "go" message
        hosts = self.round.slots
        arrays = self.shared.arrays
        config = HostConfig(**setup["config"])
        policy_obs, critic_obs = (
            ObsSpec(**_obs_spec(setup["policy_spec"])),
            setup["critic_spec"] and ObsSpec(**_obs_spec(setup["critic_spec"])),
        )
        try:
            for slot in setup["slots"]:
                env = make_env(setup["env_id"], setup["env_kwargs"])
                self.envs.append(env)
                policy = ProxyPolicy(
                    arrays,
                    slot,
                    policy_obs,
                    setup["chunk_shape"],
                    setup["execute_steps"],
                    setup["fingerprints"]["policy"],
                )
                critic = ProxyCritic(arrays, slot, critic_obs, setup["fingerprints"]["critic"]) if critic_obs else None
                hosts[slot] = RolloutHost(env, policy, critic, config, on_error=setup.get("on_error", "record"))
        except BaseException:
            self.close()
            raise
        if "torch" in sys.modules:  # an env that imports it: its threads would fight the other workers for cores
            sys.modules["torch"].set_num_threads(1)

    # -- the protocol --------------------------------------------------------
    def loop(self, conn) -> None:
        while True:
            try:
                msg = json.loads(conn.recv_bytes())
            except (EOFError, OSError):  # the parent is gone
                return
            try:
                if not self.answer(conn, msg):
                    return
            except Exception as err:  # noqa: BLE001 - a failed write (disk full), a bug: the parent stops the run
                conn.send_bytes(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
                return

    def answer(self, conn, msg: dict) -> bool:
        """One message of the protocol; False: stop."""
        if "stop" in msg:
            self.round.abort()
            ends = self.writer.flush() if self.writer is not None else []
            conn.send_bytes(json.dumps({"bye": self.timing, "ends": ends}).encode())
            return False
        if "record" in msg:  # from now on every episode is written to this shard before its end is sent
            from rollcap.rollout.recording import EpisodeRecorder

            r = msg["record"]
            self.recorder = EpisodeRecorder(r["shard_dir"], tuple(r["formats"]), r["env_meta"])
            self.writer = ShardWriter(self.recorder, r["shard"], self.timing)
            conn.send_bytes(json.dumps({"recording": 1}).encode())
            return True
        finished: list = []
        if "go" in msg:
            self.chunk(finished)
            free = [s for s, h in self.round.slots.items() if h.state is not HostState.RUNNING]
            if free and msg.get("more"):
                conn.send_bytes(json.dumps({"finished": finished, "ends": self.written(), "free": free}).encode())
                return True
        for slot, index, seed in msg.get("start", ()):
            self.round.slots[slot].start(int(index), int(seed))
        launched = self.launch(finished)
        ends = self.written(wait="flush" in msg)
        conn.send_bytes(json.dumps({"finished": finished, "ends": ends, "launched": launched}).encode())
        return True

    def written(self, wait: bool = False) -> list[dict]:
        """The outcomes of the episodes written since the last call (``wait``: every one handed over)."""
        if self.writer is None:
            out, self.unrecorded = self.unrecorded, []
            return out
        return self.writer.flush() if wait else self.writer.take()

    def launch(self, finished: list) -> list[int]:
        """The round's launch: every running slot's row written into the block; the ended (at start or launch) finish."""
        t0, c0 = time.perf_counter(), time.thread_time()
        launched = sorted(self.round.launch())
        self.finish(finished)
        self.timing["host_s"] += time.perf_counter() - t0
        self.timing["host_cpu_s"] += time.thread_time() - c0
        return launched

    def chunk(self, finished: list) -> None:
        """The parent's replay is in the block: the round's decide, execute (the whole chunk) and finish."""
        t0, c0 = time.perf_counter(), time.thread_time()
        self.round.decide()
        t1, c1 = time.perf_counter(), time.thread_time()
        self.round.execute()
        t2, c2 = time.perf_counter(), time.thread_time()
        self.timing["host_s"] += t1 - t0
        self.timing["env_s"] += t2 - t1
        self.timing["host_cpu_s"] += c1 - c0
        self.timing["env_cpu_s"] += c2 - c1
        self.finish(finished)

    def finish(self, finished: list) -> None:
        """Finish every ended episode (its slot is free) and hand its record to the writer."""
        for slot, end in self.round.finish():
            finished.append([slot, end.index])
            out = outcome(end)
            if self.writer is not None and end.record is not None and not end.dropped:
                self.writer.put(out, end.record)
            elif self.writer is not None:
                self.writer.done.append(out)
            else:
                self.unrecorded.append(out)

    def close(self) -> None:
        self.round.abort()
        if self.writer is not None:
            self.writer.close()
        if self.recorder is not None:
            self.recorder.close()
        for env in self.envs:
            env.close()
        self.shared.close()


def outcome(end: EpisodeEnd) -> dict:
    """What the parent gets of an episode: its outcome and, when it has a record, per chunk what the metrics read."""
    out = {
        "index": end.index, "seed": end.seed, "stop_reason": end.stop_reason, "success": bool(end.success),
        "steps": end.num_steps, "chunks": end.num_chunks, "error": end.error, "dropped": end.dropped,
    }  # fmt: skip
    rec = end.record
    if rec is not None:
        c = rec.chunks
        cols = ("chunk_start", "critic_value", "latency_policy_s", "latency_critic_s", "latency_boundary_s")
        out["instruction"] = rec.instruction
        out["chunk_rows"] = np.stack([np.asarray(c[k], np.float64) for k in cols], 1).tolist() if rec.num_chunks else []
    return out


class ShardWriter:
    """The worker's writer thread: records in, outcomes (digest and shard added) out once written; several a write."""

    def __init__(self, recorder, shard: str, timing: dict):
        self.recorder, self.shard, self.timing = recorder, shard, timing
        self.q: queue.Queue = queue.Queue()
        self.done: deque[dict] = deque()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._loop, name="rollcap-env-writer", daemon=True)
        self.thread.start()

    def put(self, outcome: dict, record) -> None:
        self.q.put((outcome, record))

    def _loop(self) -> None:
        while True:
            items = take_batch(self.q, 16, window_s=0.0)  # what waits: one commit (its ends flow as they are written)
            stop = items[-1] is None
            work = [i for i in items if i is not None]
            try:
                if work and self.error is None:
                    t0, c0 = time.perf_counter(), time.thread_time()
                    digests = self.recorder.write_many([r for _, r in work])
                    self.timing["write_s"] += time.perf_counter() - t0
                    self.timing["write_cpu_s"] += time.thread_time() - c0
                    for (out, _), d in zip(work, digests):
                        self.done.append({**out, "digest": d, "shard": self.shard})
            except BaseException as err:  # noqa: BLE001 - reported by take()
                self.error = f"{type(err).__name__}: {err}"
            finally:
                for _ in items:
                    self.q.task_done()
            if stop:
                return

    def take(self) -> list[dict]:
        """The outcomes written so far (a failed write raises: the worker reports it and stops)."""
        if self.error is not None:
            raise RuntimeError(f"writing the shard {self.shard} failed: {self.error}")
        out = []
        while self.done:
            out.append(self.done.popleft())
        return out

    def flush(self) -> list[dict]:
        """Wait until everything handed over is written; :meth:`take`."""
        self.q.join()
        return self.take()

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=60)


def started() -> dict:
    """What starting this worker cost: its peak resident memory (MB), its modules, and whether torch is among them."""
    return {"rss_mb": round(peak_rss_mb(), 1), "modules": len(sys.modules), "torch": "torch" in sys.modules}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: Linux's VmHWM (ru_maxrss carries the parent's peak over a spawn)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _obs_spec(d: dict) -> dict:
    """An :class:`ObsSpec`'s keyword arguments from its JSON (image keys back to a tuple)."""
    return {**d, "image_keys": tuple(d["image_keys"])}
