"""The env worker process: its slots' envs and hosts, stepped a whole chunk at a time, each episode recorded in its shard.

A worker runs the :class:`~rollcap.rollout.host.RolloutHost` of each of its
slots, over :mod:`~rollcap.rollout.workers.proxy` rows in the shared block. It
talks to the parent over one pipe, in JSON messages (never a pickle):

```
parent -> worker                       worker -> parent
{"start": [[slot, index, seed], ...]}  start them, launch every running slot -> {"launched": [slots], "ends": [...]}
{"go": 1, "more": bool}                the outputs are in the block: decide, execute the chunk, finish (record) the
                                       ended; with free slots and "more": {"ends", "free": [slots]} (a "start" follows),
                                       else launch the running ones -> {"ends", "launched": [slots]}
{"stop": 1}                            abandon what runs, close the shard -> {"bye": 1}
```

``ends`` are outcomes: index, seed, stop reason, success, steps, chunks, error,
the digest and shard of the recorded episode, and per chunk its step, critic
value and timings (what the parent's metrics and progress read). Every step's
data stays here. An episode's record is written to the shard before its end is
sent, so an end the parent reads is on disk (the parent names it in the
manifest, the commit point).

The worker ignores SIGINT (a Ctrl-C reaches the process group; the parent
decides) and imports no CUDA: torch on the CPU, for the runners' validation.

Imports point downward: ``build`` (the env), ``host``, ``config``, ``recording``, the block and the proxies.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

from rollcap.policies.observation import ObsSpec
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.workers.proxy import ProxyCritic, ProxyPolicy
from rollcap.rollout.workers.shm import Layout, SharedRows


def serve(conn, spec: str) -> None:
    """The worker's main (a spawn target): build, say ready (or why not), then answer the parent until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = Worker(json.loads(spec))
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        conn.send_bytes(json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())
        return
    conn.send_bytes(json.dumps({"ready": os.getpid()}).encode())
    try:
        worker.loop(conn)
    finally:
        worker.close()
    os._exit(0)  # everything is on disk and closed: skip the interpreter's teardown


class Worker:
    """The slots ``spec["slots"]`` of a run: one env and one host each (see the module docstring)."""

    def __init__(self, spec: dict):
        import torch

        from rollcap.rollout.build import make_env

        torch.set_num_threads(1)  # a worker steps envs; the policy is the parent's
        self.shared = SharedRows(Layout.from_json(spec["layout"]), spec["shm"])
        self.envs, self.hosts, self.recorder = [], {}, None
        arrays = self.shared.arrays
        config = HostConfig(**spec["config"])
        pspec, cspec = (
            ObsSpec(**_spec(spec["policy_spec"])),
            spec["critic_spec"] and ObsSpec(**_spec(spec["critic_spec"])),
        )
        try:
            for slot in spec["slots"]:
                env = make_env(spec["env_id"], spec["env_kwargs"])
                self.envs.append(env)
                policy = ProxyPolicy(
                    arrays, slot, pspec, spec["chunk_shape"], spec["execute_steps"], spec["fingerprints"]["policy"]
                )
                critic = ProxyCritic(arrays, slot, cspec, spec["fingerprints"]["critic"]) if cspec else None
                self.hosts[slot] = RolloutHost(env, policy, critic, config, on_error=spec.get("on_error", "record"))
        except BaseException:
            self.close()
            raise
        self.shard: str | None = None
        self.launched: dict[int, object] = {}
        self.timing = {"host_s": 0.0, "env_s": 0.0, "write_s": 0.0}

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
            conn.send_bytes(json.dumps({"bye": self.timing}).encode())
            return False
        if "record" in msg:  # from now on every episode is written to this shard before its end is sent
            from rollcap.rollout.recording import EpisodeRecorder

            r = msg["record"]
            self.recorder = EpisodeRecorder(r["shard_dir"], tuple(r["formats"]), r["env_meta"])
            self.shard = r["shard"]
            conn.send_bytes(json.dumps({"recording": 1}).encode())
            return True
        ends: list[dict] = []
        if "go" in msg:
            self.chunk(ends)
            free = [s for s, h in self.hosts.items() if h.state is not HostState.RUNNING]
            if free and msg.get("more"):
                conn.send_bytes(json.dumps({"ends": ends, "free": free}).encode())
                return True
        for slot, index, seed in msg.get("start", ()):
            self.hosts[slot].start(int(index), int(seed))
        self.launch(ends)
        conn.send_bytes(json.dumps({"ends": ends, "launched": sorted(self.launched)}).encode())
        return True

    def launch(self, ends: list[dict]) -> None:
        """Launch every running slot (its row written), then draw each one's next noise while the parent replays."""
        t0 = time.perf_counter()
        for slot, h in self.hosts.items():
            if h.state is HostState.RUNNING:
                ticket = h.launch()
                if ticket is not None:
                    self.launched[slot] = ticket
        self.finish(ends)  # an episode that ended at its start or launch
        for slot in self.launched:
            self.hosts[slot].draw_ahead()
        self.timing["host_s"] += time.perf_counter() - t0

    def chunk(self, ends: list[dict]) -> None:
        """The parent's outputs are in the block: every launched slot decides, then executes its chunk; the ended finish."""
        launched, self.launched = self.launched, {}
        t0 = time.perf_counter()
        for slot, ticket in launched.items():
            self.hosts[slot].decide(ticket)
        t1 = time.perf_counter()
        for slot in launched:
            h = self.hosts[slot]
            if h.state is HostState.RUNNING:
                h.execute()
        t2 = time.perf_counter()
        self.timing["host_s"] += t1 - t0
        self.timing["env_s"] += t2 - t1
        self.finish(ends)

    def finish(self, ends: list[dict]) -> None:
        for slot, h in self.hosts.items():
            if h.state is HostState.STOP_INFER:
                ends.append({"slot": slot, **self.outcome(h.finish())})

    def outcome(self, end: EpisodeEnd) -> dict:
        """What the parent gets of an episode: its outcome, where it is recorded, and per chunk what the metrics read."""
        out = {
            "index": end.index, "seed": end.seed, "stop_reason": end.stop_reason, "success": bool(end.success),
            "steps": end.num_steps, "chunks": end.num_chunks, "error": end.error, "dropped": end.dropped,
        }  # fmt: skip
        rec = end.record
        if rec is not None:
            c = rec.chunks
            cols = ("chunk_start", "critic_value", "latency_policy_s", "latency_critic_s", "latency_boundary_s")
            out["instruction"] = rec.instruction
            out["chunk_rows"] = (
                np.stack([np.asarray(c[k], np.float64) for k in cols], 1).tolist() if rec.num_chunks else []
            )
            if self.recorder is not None and not end.dropped:
                t0 = time.perf_counter()
                (digest,) = self.recorder.write_many([rec])
                self.timing["write_s"] += time.perf_counter() - t0
                out.update(digest=digest, shard=self.shard)
        return out

    def close(self) -> None:
        for h in self.hosts.values():
            h.abort()
        if self.recorder is not None:
            self.recorder.close()
        for env in self.envs:
            env.close()
        self.shared.close()


def _spec(d: dict) -> dict:
    return {**d, "image_keys": tuple(d["image_keys"])}
