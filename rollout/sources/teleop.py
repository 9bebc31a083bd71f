"""The teleop source: a person in the loop, one episode at a time in this process.

Keys, status and a live view around one event bus (:mod:`rollcap.rollout.teleop`);
the reset waits for the go key. A discarded episode is re-recorded under its
index; quit ends the run after the episode; a rewound one is kept as it ran and
its retry is recorded under the next spare index.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from rollcap.rollout.build import Built
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.offline.rewind import RewindBuffer
from rollcap.rollout.protocols import EpisodeEnd
from rollcap.rollout.seeding import retry_seed
from rollcap.rollout.spec import Spec
from rollcap.rollout.teleop import TeleopConfig, open_teleop


class TeleopSource:
    """A person drives the episodes (see :mod:`rollcap.rollout.sources`); ``spare_from``: the first index a retry takes."""

    def __init__(self, spec: Spec, built: Built, subscribers: list, spare_from: int):
        self.tele = open_teleop(TeleopConfig(source=spec.run.teleop)).__enter__()
        try:
            self.host = RolloutHost(
                built.env,
                built.policy,
                built.critic,
                spec.host,
                subscribers + self.tele.subscribers,
                events=self.tele.bus,
                reset_hook=self.tele.reset_hook,
            )
        except BaseException:
            self.tele.__exit__(None, None, None)
            raise
        self.spare = itertools.count(spare_from)
        self._open = True

    def start(self) -> None:
        pass

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Episodes with a person in the loop (see the module docstring)."""
        host, tele = self.host, self.tele
        rewind = RewindBuffer.on(host) if host.state_env is not None else None  # the last 8 boundaries
        for index, seed in todo:
            while True:
                end = host.run_episode(index, seed)
                yield end
                if not end.dropped or tele.quit_requested:
                    break
            while rewind is not None and end.stop_reason == "rewind" and rewind.kept and not tele.quit_requested:
                at = rewind.resume_requested()
                end = host.run_episode(next(self.spare), retry_seed(end.seed, at.chunk, rewind.attempts), at)
                yield end
            if tele.quit_requested:
                return

    def close(self) -> None:
        """The episode running is abandoned; the key source stops, the terminal is restored."""
        self.host.abort()
        if self._open:
            self._open = False
            self.tele.__exit__(None, None, None)

    def summary(self) -> dict:
        return {}
