"""RecordBuilder: an :class:`EpisodeRecord` assembled from the host's events.

The host keeps no per-step lists; this subscriber does, and only while
something wants records. It is the first subscriber of a host built with
``records=True``, so later subscribers (recorders) find the finished record in
``EpisodeEnd.record``.

Imports point downward: this module knows ``episode`` and ``protocols`` only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rollcap.envs import physics_row
from rollcap.rollout.episode import CHUNK_DTYPES, FLOW_CHUNK_DTYPES, RTC_CHUNK_DTYPES, STEP_DTYPES, EpisodeRecord
from rollcap.rollout.protocols import (
    RAW_OBS_KEY,
    ChunkEvent,
    EpisodeEnd,
    EpisodeStart,
    StepEvent,
    Subscriber,
    recorded_obs,
)

_STEP_COLS = tuple(k for k in STEP_DTYPES if k != "dones")  # dones is derived


class RecordBuilder(Subscriber):
    """Collects one episode at a time; fills ``EpisodeEnd.record`` at its end. Single-threaded."""

    def __init__(self):
        self._start: EpisodeStart | None = None

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._start = start
        self._obs: dict[str, list] = {}
        self._final = start.obs  # an episode stopped at its first boundary keeps the observation that boundary saw
        self._steps: dict[str, list] = {k: [] for k in _STEP_COLS}
        self._chunks: dict[str, list] = {k: [] for k in CHUNK_DTYPES}

    def on_chunk(self, e: ChunkEvent) -> None:
        c = self._chunks
        c["noise"].append(e.noise)
        c["policy_chunk"].append(e.actions)
        c["critic_value"].append(e.value)
        c["chunk_start"].append(e.step)
        c["latency_policy_s"].append(e.latency_policy_s)
        c["latency_critic_s"].append(e.latency_critic_s)
        c["latency_boundary_s"].append(e.latency_boundary_s)
        if e.carried is not None:  # real-time chunking: what the chunk was guided by
            c.setdefault("rtc_carried", []).append(e.carried["carried"])
            c.setdefault("rtc_weights", []).append(e.carried["carried_w"])
        if e.flow is not None:  # a stochastic sampler: what the chunk's log-probability needs
            for k, v in e.flow.items():
                c.setdefault(f"flow_{k}", []).append(v)

    def on_step(self, e: StepEvent) -> None:
        obs, kept = e.obs, self._obs
        if isinstance(obs, Mapping):  # recorded_obs, without building a dict every step
            for k, v in obs.items():
                if k != "instruction":
                    rows = kept.get(k)
                    if rows is None:
                        rows = kept[k] = []
                    rows.append(v)
        else:
            kept.setdefault(RAW_OBS_KEY, []).append(obs)
        s = self._steps
        s["actions"].append(np.asarray(e.action, dtype=np.float32))
        s["rewards"].append(e.reward)
        s["terminated"].append(e.terminated)
        s["truncated"].append(e.truncated)
        s["actor"].append(e.actor)
        s["states"].append(e.state)
        self._final = e.next_obs

    def on_episode_end(self, end: EpisodeEnd) -> None:
        start, self._start = self._start, None
        if start is None or end.dropped:
            return
        end.record = self._build(start, end)

    def _build(self, start: EpisodeStart, end: EpisodeEnd) -> EpisodeRecord:
        t = len(self._steps["actions"])
        horizon_shape = tuple(start.chunk_shape)
        a_dim = horizon_shape[-1]
        steps = {}
        for k, rows in self._steps.items():
            dt = STEP_DTYPES[k]
            if k == "actions":
                steps[k] = np.asarray(rows, dtype=dt).reshape(t, a_dim)
            elif k == "states":
                width = len(rows[0]) if rows else len(physics_row(start.initial_state))
                steps[k] = np.asarray(rows, dtype=dt).reshape(t, width)
            else:
                steps[k] = np.asarray(rows, dtype=dt).reshape(t)
        steps["dones"] = steps["terminated"] | steps["truncated"]
        chunks = {}
        for k, dt in CHUNK_DTYPES.items():
            rows = self._chunks[k]
            shape = (len(rows), *horizon_shape) if k in ("noise", "policy_chunk") else (len(rows),)
            chunks[k] = np.asarray(rows, dtype=dt).reshape(shape)
        if "rtc_carried" in self._chunks:
            n = len(self._chunks["noise"])
            chunks["rtc_carried"] = np.asarray(self._chunks["rtc_carried"], RTC_CHUNK_DTYPES["rtc_carried"]).reshape(
                n, *horizon_shape
            )
            chunks["rtc_weights"] = np.asarray(self._chunks["rtc_weights"], RTC_CHUNK_DTYPES["rtc_weights"]).reshape(
                n, horizon_shape[0]
            )
        for k, dt in FLOW_CHUNK_DTYPES.items():
            if k in self._chunks:
                rows = self._chunks[k]
                chunks[k] = np.asarray(rows, dt).reshape(len(rows), *np.shape(rows[0]))
        record = EpisodeRecord(
            index=start.index,
            seed=start.seed,
            env_id=start.env_id,
            env_kwargs=start.env_kwargs,
            instruction=start.instruction,
            initial_state={k: np.array(v, copy=True) for k, v in start.initial_state.items()},
            obs={k: np.stack(v) for k, v in self._obs.items()},
            final_obs={k: np.asarray(v) for k, v in recorded_obs(self._final).items()},
            steps=steps,
            chunks=chunks,
            stop_reason=end.stop_reason,
            success=end.success,
            fingerprints=start.fingerprints,
            config=start.config,
            error=end.error,
            origin=start.origin,
            control_period_s=start.control_period_s,
        )
        record.validate()
        return record
