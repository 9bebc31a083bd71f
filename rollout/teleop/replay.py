"""Closed-loop replay of an episode a person steered: its recorded inputs, re-issued on the bus.

An intervened episode depends on more than its seed: on which steps a human
drove (and with what action) and on when it was ended from outside. The
record holds both (``steps["actor"]``, ``steps["actions"]``, ``stop_reason``),
so :class:`ReplayInputs` replays them through the same :class:`EventBus`
verbs the keys used, at the same steps, and the host does the rest exactly as
it did: hand-backs end the chunk, noise follows the chunk index, a stop is
polled before the next step or launch.
"""

from __future__ import annotations

import numpy as np

from rollcap.rollout.episode import ACTOR_HUMAN, EpisodeRecord
from rollcap.rollout.events import EventBus
from rollcap.rollout.protocols import ChunkEvent, EpisodeStart, StepEvent, Subscriber


class ReplayInputs(Subscriber):
    """Re-issues a recorded episode's takeover actions and its external stop on ``bus``.

    Use it with a host built with ``events=bus`` and this subscriber, then
    :func:`rollcap.rollout.offline.replay.replay_closed` (or ``run_episode``) as usual.
    Before every env step it sets ``bus.intervene`` to the recorded human
    action, or None where the policy acted; after the last recorded step (or
    the last boundary, when the episode ended there) it requests the recorded
    stop reason. A stop the env or a predicate makes by itself happens first
    and wins, so natural endings replay unchanged.

    Args:
        rec: the episode to replay.
        bus: the host's event bus.
    """

    def __init__(self, rec: EpisodeRecord, bus: EventBus):
        self.bus = bus
        self._human = np.asarray(rec.steps["actor"]) == ACTOR_HUMAN
        self._actions = np.asarray(rec.steps["actions"])
        self._steps = rec.num_steps
        self._reason = rec.stop_reason
        starts = rec.chunks["chunk_start"]
        # Ended at a boundary after its chunk was launched (nothing of it ran): stop right after that launch.
        self._stop_chunk = rec.num_chunks - 1 if rec.num_chunks and int(starts[-1]) == self._steps else None

    def _before_step(self, t: int) -> None:
        if t < self._steps and self._human[t]:
            self.bus.intervene(self._actions[t])
        else:
            self.bus.intervene(None)
        if t == self._steps and self._stop_chunk is None:
            self.bus.request_stop(self._reason)

    def on_episode_start(self, start: EpisodeStart) -> None:
        self._before_step(0)

    def on_chunk(self, chunk: ChunkEvent) -> None:
        self._before_step(chunk.step)
        if chunk.chunk == self._stop_chunk:
            self.bus.request_stop(self._reason)

    def on_step(self, step: StepEvent) -> None:
        self._before_step(step.step + 1)
