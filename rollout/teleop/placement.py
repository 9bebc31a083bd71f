"""A run's episodes in a person's hands: one at a time in this process (``rollcap run --teleop``).

Keys, status and a live view around one event bus (:func:`~rollcap.rollout.teleop.session.open_teleop`,
entered in :meth:`TeleopPlacement.start`); the reset waits for the go key. A discarded episode is
re-recorded under its index; quit ends the run after the episode; a rewound one is kept as it ran and
its retry is recorded under the next spare index. The host's own driver
(:meth:`~rollcap.rollout.host.RolloutHost.run_episode`), not the batched round: a person drives one
episode, and a retry starts at another episode's boundary.

Imports point downward: ``placement``, ``host``, ``seeding``, this package's ``session`` and ``rewind``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack

from rollcap.rollout.build import Built
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.placement import Placement
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.seeding import retry_seed
from rollcap.rollout.spec import Spec
from rollcap.rollout.teleop.rewind import RewindBuffer
from rollcap.rollout.teleop.session import TeleopConfig, TeleopSession, open_teleop


class TeleopPlacement(Placement):
    """A person drives the episodes (see the module docstring); ``spare_from``: the first index a retry takes."""

    def __init__(self, spec: Spec, built: Built, spare_from: int):
        super().__init__(spec, built)
        self.spare = itertools.count(spare_from)
        self.host: RolloutHost | None = None
        self.session: TeleopSession | None = None
        self._stack = ExitStack()

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """The key source, the status line and the live view start (the terminal in raw mode): :meth:`close` ends them."""
        tele = self.session = self._stack.enter_context(open_teleop(TeleopConfig(source=self.spec.run.teleop)))
        made = self.identity
        self.host = RolloutHost(
            self.built.env, made.policy, made.critic, self.spec.host, [*subscribers, *tele.subscribers],
            events=tele.bus, reset_hook=tele.reset_hook,
        )  # fmt: skip

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        """Episodes with a person in the loop (see the module docstring)."""
        host, tele = self.host, self.session
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
        if self.host is not None:
            self.host.abort()
        self._stack.close()
