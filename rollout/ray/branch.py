"""Branches on Ray actors: a rollout actor that also runs an episode from a recorded boundary.

:func:`rollcap.rollout.offline.branch.run_branches` takes a pool of these
(``pool=``) to run its branches on actors instead of in the calling process.
"""

from __future__ import annotations

from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.ray.episodes import RolloutActor
from rollcap.rollout.resume import Resume


class BranchActor(RolloutActor):
    """A :class:`~rollcap.rollout.ray.episodes.RolloutActor` that also runs an episode from a boundary."""

    def branch(self, index: int, seed: int, config, at: Resume) -> EpisodeRecord:
        """Run episode ``index`` with ``seed`` from ``at`` (see :meth:`RolloutHost.start`) and return its record."""
        return self.host(config).run_episode(index, seed, at).record
