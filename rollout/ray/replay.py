"""``rollcap replay --actors N``: replay a large run's episodes on Ray actors.

Each actor is a :class:`~rollcap.rollout.offline.replay.Replayer` (its own policy,
critic and envs); the driver reads the recordings, sends each episode to an
idle actor and prints the results in the order of the files, so the output is
the same with 1 or N actors. Episodes go to the actors as records, not as
paths: on a cluster the run directory need not be visible from every node.

An actor that dies mid-episode is replaced and the episode is checked again
(:meth:`~rollcap.rollout.ray.actors.ActorPool.map`); one that fails every try
is reported ``FAILED`` — never counted as exact.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from rollcap.rollout.spec import Parts
from rollcap.rollout.config import HostConfig
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.ray.episodes import _SHIPPED
from rollcap.rollout.ray.actors import MAX_TRIES, ActorPool, ActorResources
from rollcap.rollout.offline.replay import Replayer, ReplayResult


class ReplayActor(Replayer):
    """A :class:`Replayer` built the way :class:`ActorPool` builds its actors (``parts, config, shipped``)."""

    def __init__(self, parts: Parts, config: HostConfig | None = None, shipped: tuple[str, ...] = ()):
        super().__init__(replace(parts, **{k: _SHIPPED[k] for k in shipped}))

    def ready(self) -> dict:
        ray = sys.modules.get("ray")
        node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
        return {"pid": os.getpid(), "node": node}


def replay_on_actors(
    items: Iterable[tuple[str, EpisodeRecord | Exception]],
    modes: Sequence[str],
    parts: Parts,
    num_actors: int,
    address: str | None = None,
    resources: ActorResources = ActorResources(),
    import_env: bool = False,
    max_tries: int = MAX_TRIES,
    summary: dict | None = None,
    actor_cls: type = ReplayActor,
) -> Iterator[list[ReplayResult]]:
    """Check every ``(source, record)`` of ``items`` on ``num_actors`` actors; yield each episode's results in input order.

    An item that is an exception (an episode that could not be read) yields
    its ``FAILED`` result without reaching an actor. ``summary``, if given, is
    kept up to date with the pool's :meth:`~ActorPool.summary`.
    """
    items = list(items)
    done: dict[int, list[ReplayResult]] = {}
    next_out = 0
    with ActorPool(parts, HostConfig(), num_actors, address, resources, actor_cls=actor_cls) as pool:
        work = []
        for pos, (source, rec) in enumerate(items):
            if isinstance(rec, Exception):
                done[pos] = [ReplayResult.could_not(source, "all", rec)]
            else:
                work.append(pos)
        call = lambda handle, pos: handle.check.remote(*items[pos], tuple(modes), import_env)  # noqa: E731
        results = pool.map(call, work, max_tries=max_tries)
        while next_out < len(items):
            while next_out in done:
                if summary is not None:
                    summary.update(pool.summary())
                yield done.pop(next_out)
                next_out += 1
            if next_out >= len(items):
                break
            try:
                pos, res = next(results)
            except StopIteration:  # the rest failed on every try
                for pos, why in pool.failed.items():
                    if pos >= next_out and pos not in done:
                        source, rec = items[pos]
                        done[pos] = [
                            ReplayResult.could_not(
                                source, "all", RuntimeError(f"on a Ray actor, {max_tries} tries: {why}"), rec.index
                            )
                        ]
                if next_out not in done:
                    raise RuntimeError(f"replay on actors: no result for item {next_out}") from None
                continue
            done[pos] = res
