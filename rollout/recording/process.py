"""An :class:`EpisodeRecorder` in a child process: the writer's CPU, and its hold on the GIL, leave the rollout's process.

A background writer thread (:class:`~rollcap.rollout.subscribers.InBackground`)
shares the rollout's GIL: HDF5 calls and the npz zip writing hold it, so at
GPU speed (tens of episodes a second) the host thread waits for it
(``rollcap bench --only recording``, "at 50 episodes/s"). :class:`WriterProcess`
runs the recorder in a process of its own and hands it each finished episode
over a pipe as bytes: a JSON header (the record's JSON fields; each array's
name, dtype and shape) and the arrays' raw bytes, never a pickle. The child
rebuilds the record, checks it as every write does, and writes whatever
waits in one :meth:`~EpisodeRecorder.write_many` (one HDF5 commit), so a child that falls
behind catches up. Atomicity, the journal, digests and resume are the
recorder's own.

Flow: the host thread encodes an episode and queues it; a sender thread
writes it into the pipe (a pipe holds 64 KB, so a send waits for the child
to read). The child acknowledges each write; at most ``max_pending`` episodes
are unacknowledged before :meth:`WriterProcess.on_episode_end` waits (bounded
memory, as ``InBackground``). A failure in the child is raised on the host
thread at the next call as :class:`RecordingFailed`; the child writes
nothing after it. The child ignores SIGINT (a Ctrl-C reaches the whole
process group): the parent decides, by :meth:`~WriterProcess.close` (write
everything sent) or :meth:`~WriterProcess.abandon` (finish the write under
way, drop the rest). If the parent dies, the child writes what it holds and
exits at the pipe's end.

Imports point downward: this module knows ``kernels.files``, ``episode``,
``errors``, ``protocols`` and the recorder.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue
import signal
import struct
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np

from rollcap.kernels.files import plain_json
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import RecordingFailed
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.recording.codec import TABLES, byte_view
from rollcap.rollout.recording.recorder import FORMATS, EpisodeRecorder

_LEN = struct.Struct("<Q")
_CLOSE = b"close"
_BATCH = 16  # episodes the child takes into one write_many at most


def encode(record: EpisodeRecord) -> bytes:
    """``record`` as one message: header length, JSON header, the arrays' bytes in header order."""
    fields, arrays = {}, []
    for f in dataclasses.fields(EpisodeRecord):
        value = getattr(record, f.name)
        if f.name in TABLES:
            fields[f.name] = [[k, a.dtype.str, list(a.shape)] for k, a in value.items()]
            arrays.extend(byte_view(np.asarray(a)) for a in value.values())
        else:
            fields[f.name] = plain_json(value)
    head = json.dumps(fields, allow_nan=True).encode()
    return b"".join([_LEN.pack(len(head)), head, *arrays])


def decode(msg: bytes) -> EpisodeRecord:
    """The record :func:`encode` wrote (arrays are views of ``msg``, read-only)."""
    (n,) = _LEN.unpack_from(msg)
    fields = json.loads(msg[_LEN.size : _LEN.size + n])
    buf, pos = memoryview(msg), _LEN.size + n
    for table in TABLES:
        out = {}
        for k, dtype, shape in fields[table]:
            dt = np.dtype(dtype)
            size = dt.itemsize * int(np.prod(shape, dtype=np.int64))
            out[k] = np.frombuffer(buf[pos : pos + size], dtype=dt).reshape(shape)
            pos += size
        fields[table] = out
    return EpisodeRecord(**fields)


def _serve(data, conn, run_dir: str, formats, env_meta, resume: bool, abandon) -> None:
    """The child: build the recorder, report its indices on ``conn``, then write what arrives on ``data`` until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        recorder = EpisodeRecorder(run_dir, formats, env_meta, resume)
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send_bytes(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
        return
    conn.send_bytes(json.dumps({"indices": recorder.indices}).encode())
    failed, discarded, done, cpu0 = False, [], False, time.process_time()
    while not done:
        try:
            msgs = [data.recv_bytes()]
            while len(msgs) < _BATCH and msgs[-1] != _CLOSE and data.poll():
                msgs.append(data.recv_bytes())
        except (EOFError, OSError):  # the parent is gone: nothing more will come
            msgs, done = [], True
        done = done or msgs[-1:] == [_CLOSE]
        records = [decode(m) for m in msgs if m != _CLOSE]
        reply: dict = {"acked": len(records)}
        if records and (failed or abandon.is_set()):
            discarded.extend(r.index for r in records)
        elif records:
            try:
                reply["written"] = [[r.index, d] for r, d in zip(records, recorder.write_many(records))]
            except BaseException as err:  # noqa: BLE001 - reported to the parent
                failed, reply["error"] = True, f"{type(err).__name__}: {err}"
        if done:
            recorder.close()
            reply.update(closed=True, discarded=discarded, cpu_s=time.process_time() - cpu0)
        try:
            conn.send_bytes(json.dumps(reply).encode())
        except (BrokenPipeError, OSError):
            return
    os._exit(0)  # everything is on disk and closed: skip the interpreter's teardown (torch's takes a second or more)


class WriterProcess(Subscriber):
    """Writes every finished episode to ``run_dir`` from a child process (see the module docstring).

    Args:
        run_dir, formats, env_meta, resume: as :class:`EpisodeRecorder` (built in the child; a refusal
            there, such as a run directory that already holds episodes, is raised here).
        max_pending: episodes sent but not yet written before :meth:`on_episode_end` waits.
        on_written: called ``(index, digest)`` on this thread for each episode the child has written
            (:class:`WriterPool` names it in the run's manifest).

    Single-threaded: call it from the host's thread.
    """

    wants_records = True

    def __init__(
        self,
        run_dir,
        formats=FORMATS,
        env_meta: dict | None = None,
        resume: bool = False,
        max_pending: int = 8,
        on_written=None,
    ):
        ctx = multiprocessing.get_context("spawn")  # the rollout has threads (lanes): never fork them
        data_in, data_out = ctx.Pipe(duplex=False)
        self._conn, reply_out = ctx.Pipe(duplex=False)
        self._abandon = ctx.Event()
        self._proc = ctx.Process(
            target=_serve,
            args=(data_in, reply_out, str(run_dir), tuple(formats), env_meta, resume, self._abandon),
            name="rollcap-writer",
            daemon=True,
        )
        self._proc.start()
        data_in.close()
        reply_out.close()
        # A sender thread writes the messages into the pipe: the host thread only encodes and queues
        # (a pipe holds 64 KB; a send would otherwise wait for the child to read a whole episode).
        self._out: queue.Queue = queue.Queue()
        self._send_error: BaseException | None = None
        self._sender = threading.Thread(
            target=self._send_loop, args=(data_out,), name="rollcap-writer-send", daemon=True
        )
        self._sender.start()
        self.max_pending, self._pending, self._closed, self._on_written = max_pending, 0, False, on_written
        self._error: str | None = None
        self.discarded: list[int] = []
        """Indices of episodes dropped after :meth:`abandon` (never written)."""
        self.writer_cpu_s: float | None = None
        """The child's CPU seconds from its recorder's start to its close (start-up imports aside), once closed."""
        self.episodes = 0
        first = self._recv()
        if "error" in first:
            self._out.put(None)
            self._proc.join()
            raise RecordingFailed(f"the writer process could not start: {first['error']}")
        self._indices = set(first["indices"])

    @property
    def next_index(self) -> int:
        """The first episode index after every one the run directory held at start."""
        return max(self._indices, default=-1) + 1

    def _send_loop(self, conn) -> None:
        try:
            while True:
                msg = self._out.get()
                if msg is None:
                    return
                conn.send_bytes(msg)
        except BaseException as err:  # noqa: BLE001 - the child is gone; _recv says so
            self._send_error = err
        finally:
            conn.close()

    def _recv(self) -> dict:
        try:
            msg = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as err:
            raise RecordingFailed(f"the writer process died (exit code {self._proc.exitcode})") from err
        self._pending -= msg.get("acked", 0)
        if self._on_written is not None:
            for index, digest in msg.get("written", ()):
                self._on_written(index, digest)
        if msg.get("error") and self._error is None:
            self._error = msg["error"]
        return msg

    @property
    def pending(self) -> int:
        """Episodes sent and not yet written."""
        return self._pending

    def poll(self) -> None:
        """Take the child's replies so far (written episodes, a failure, raised as :class:`RecordingFailed`); never waits."""
        self._raise()

    def _raise(self) -> None:
        while self._conn.poll():
            self._recv()
        if self._error is not None:
            err, self._error = self._error, None
            raise RecordingFailed(f"EpisodeRecorder failed in its writer process: {err}")

    def on_episode_end(self, end: EpisodeEnd) -> None:
        """Send the episode's record to the child (a dropped episode has none); waits while ``max_pending`` are unwritten."""
        if self._closed:
            raise RuntimeError("WriterProcess: on_episode_end() after close()")
        self._raise()
        if end.record is None:
            return
        while self._pending >= self.max_pending:
            self._recv()
        self._raise()
        self._out.put(encode(end.record))
        self._pending += 1
        self.episodes += 1

    def flush(self) -> None:
        """Wait until every episode sent is written."""
        while self._pending > 0:
            self._recv()
        self._raise()

    def abandon(self) -> None:
        """Finish the write under way, drop the episodes still waiting (safe from a signal handler)."""
        self._abandon.set()

    def on_run_end(self) -> None:
        self.close()

    def close(self) -> None:
        """Write everything sent (or, after :meth:`abandon`, drop it), stop the child (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._out.put(_CLOSE)
        self._out.put(None)
        try:
            while True:
                msg = self._recv()
                if msg.get("closed"):
                    self.discarded, self.writer_cpu_s = msg["discarded"], msg["cpu_s"]
                    break
        finally:
            self._sender.join(timeout=60)
            self._proc.join(timeout=60)
            self._conn.close()
        if self._error is not None:
            err, self._error = self._error, None
            raise RecordingFailed(f"EpisodeRecorder failed in its writer process: {err}")


class WriterPool(Subscriber):
    """``writers`` :class:`WriterProcess` es, each recording its own shard of a sharded run, for more episodes a second than one writes.

    One HDF5 file takes one writer, so each process writes ``shards/sNNN`` of the sharded
    layout (:mod:`~rollcap.rollout.recording.shards`, as Ray actors do); the manifest, appended
    here once a shard holds an episode in every format, is the commit point. Readers see one
    run (:mod:`~rollcap.rollout.recording.runs`); ``rollcap merge`` writes the single-file layout.
    Each episode goes to the writer with the fewest unwritten. Single-threaded.

    Args:
        run_dir, formats, env_meta, resume: as :class:`~rollcap.rollout.recording.shards.ManifestWriter`.
        writers: processes (shards).
        max_pending: per writer, as :class:`WriterProcess`.
    """

    wants_records = True

    def __init__(
        self,
        run_dir,
        writers: int = 2,
        formats=FORMATS,
        env_meta: dict | None = None,
        resume: bool = False,
        max_pending: int = 8,
    ):
        from rollcap.rollout.recording.shards import SHARDS_DIR, ManifestWriter

        if not isinstance(writers, int) or writers < 1:
            raise ValueError(f"writers: expected an integer >= 1, got {writers!r}")
        self.manifest = ManifestWriter(run_dir, formats, env_meta, resume)
        self._writers: list[WriterProcess] = []
        self.discarded: list[int] = []
        """Indices of episodes dropped after :meth:`abandon` (never written)."""
        try:
            for k in range(writers):
                shard = f"{SHARDS_DIR}/s{k:03d}"
                add = partial(self._add, shard)
                self._writers.append(
                    WriterProcess(Path(run_dir) / shard, formats, self.manifest.env_meta, True, max_pending, add)
                )
        except BaseException:
            self.close()
            raise

    def _add(self, shard: str, index: int, digest: str) -> None:
        self.manifest.add(index, digest, shard)

    @property
    def next_index(self) -> int:
        """The first episode index after every one the run held at start."""
        return max(self.manifest.indices, default=-1) + 1

    @property
    def episodes(self) -> int:
        """Episodes handed to the writers."""
        return sum(w.episodes for w in self._writers)

    @property
    def writer_cpu_s(self) -> float | None:
        """The writers' CPU seconds together, once closed."""
        cpu = [w.writer_cpu_s for w in self._writers]
        return None if None in cpu else sum(cpu)

    def on_episode_end(self, end: EpisodeEnd) -> None:
        """Hand the episode to the least busy writer (each takes the replies so far first)."""
        for w in self._writers:
            w.poll()
        min(self._writers, key=lambda w: w.pending).on_episode_end(end)

    def flush(self) -> None:
        for w in self._writers:
            w.flush()

    def abandon(self) -> None:
        for w in self._writers:
            w.abandon()

    def on_run_end(self) -> None:
        self.close()

    def close(self) -> None:
        """Close every writer (each writes what it was sent, naming it in the manifest), then the manifest; the first failure is raised."""
        failure = None
        for w in self._writers:
            try:
                w.close()
            except Exception as err:  # noqa: BLE001 - every writer still closes
                failure = failure or err
            self.discarded.extend(w.discarded)
        self.manifest.close()
        if failure is not None:
            raise failure
