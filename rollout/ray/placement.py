"""A run's episodes on Ray actors: each actor builds its own envs and runners and runs the round there.

The actors start in :meth:`ActorsPlacement.start` (:meth:`~rollcap.rollout.ray.actors.ActorPool.for_run`,
checked against this process's identity: the resolved config and the weights). Where the episodes are
recorded follows the run: with ``shards`` (the run's manifest) each actor writes its own shard and this
process names each episode in the manifest (:class:`Shards`); without, the
actors send each episode here and a writer among the subscribers records it. At ``envs`` N each actor
drives N envs on graphs at batch N (:func:`~rollcap.rollout.ray.actors.stream_batches`).

Sharded recording on actors: each actor writes its own shard, the driver writes the manifest.

:class:`Shards` tells each new actor of an :class:`~rollcap.rollout.ray.actors.ActorPool`
its shard (``shards/s000``, ``s001``, ...; a replacement gets a new one, so no
shard ever has two writers, and a resumed run's numbers follow the ones on
disk), and :meth:`Shards.episodes` runs episodes on the pool: each actor
records its episode in its shard (npz and HDF5, atomic and journaled, as
:class:`~rollcap.rollout.recording.EpisodeRecorder` always does) and answers
with a receipt (index, digest, shard, node) and the record without its
images. The driver appends the receipt to ``manifest.jsonl``
(:class:`~rollcap.rollout.recording.shards.ManifestWriter`) and then hands
the light record to the run's subscribers (metrics, progress, the caller's:
they see every field but the camera frames).

Exactly once: an episode is part of the run when its manifest line is
written, and the driver writes one line per index, for the first answer it
gets. An actor killed after writing its shard and before its answer arrived
leaves a copy no line names (readers ignore it; the episode runs again
elsewhere). With ``envs`` N per actor (:func:`~rollcap.rollout.ray.actors.stream_batches`)
a call runs several episodes and answers for each as it ends (written first),
so the same holds per episode: a lost call's answered episodes are named, the
rest run again.

Per-node shard directories (``shard_dir``, ``rollcap run --shard-dir DIR``,
for a cluster without a shared filesystem): each actor writes its shard to
``DIR/<run name>/sNNN`` on its own node, and the manifest names that absolute
path and the node. The numbers are the driver's, unique across nodes. At the
end one line says where the shards are when some are not on this machine.

Imports point downward: this module knows ``recording``, ``placement``, ``ray.actors`` and ``ray.episodes``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from rollcap.rollout.build import Built
from rollcap.rollout.placement import Placement
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.ray.actors import MAX_TRIES, ActorPool, stream_batches
from rollcap.rollout.ray.episodes import emit, episode_specs
from rollcap.rollout.recording.shards import SHARDS_DIR, ManifestWriter
from rollcap.rollout.spec import Spec


class ActorsPlacement(Placement):
    """The slots on a pool of Ray actors (see the module docstring)."""

    elsewhere = True

    def __init__(self, spec: Spec, built: Built):
        super().__init__(spec, built)
        self.pool: ActorPool | None = None
        self.shards: Shards | None = None
        self.subscribers: list[Subscriber] = []

    def start(self, subscribers: Sequence[Subscriber], shards, poll_stop: Callable[[], None]) -> None:
        """Start the actors (each told its shard first, with ``shards``); ``poll_stop`` while Ray and they start."""
        self.subscribers = list(subscribers)
        if shards is not None:
            self.shards = Shards(shards, shards.env_meta, self.spec.run.shard_dir)
        setup = None if self.shards is None else self.shards.setup
        self.pool = ActorPool.for_run(self.spec, self.identity, setup=setup, poll_stop=poll_stop)

    def episodes(self, todo: Iterable[tuple[int, int]]) -> Iterator[EpisodeEnd]:
        if self.shards is not None:
            return self.shards.episodes(self.pool, todo, self.subscribers)
        return self.pool.episodes(todo, self.subscribers)

    def close(self) -> None:
        """The actors stop; an episode still running on one is not recorded."""
        if self.pool is not None:
            self.pool.close()

    def summary(self) -> dict:
        return {} if self.pool is None else self.pool.summary()


class Shards:
    """Names and opens the shard of every actor a pool starts; pass :meth:`setup` as the pool's ``setup``.

    Args:
        manifest: the run's manifest (its run directory holds ``shards/``).
        env_meta: robomimic's env metadata for the shards' HDF5 files.
        shard_dir: a directory every node has: shards go to ``<shard_dir>/<run name>/`` on each actor's node (None: the run directory).
    """

    def __init__(self, manifest: ManifestWriter, env_meta: dict, shard_dir: Path | None = None):
        self.manifest, self.env_meta = manifest, env_meta
        self.root = (
            None if shard_dir is None else Path(shard_dir).expanduser().absolute() / manifest.run_dir.resolve().name
        )  # as every node reads it
        here = (
            sorted(p.name for p in self.root.iterdir() if p.is_dir())
            if self.root is not None and self.root.is_dir()
            else []
        )
        names = [
            *manifest.shard_names(),
            *here,
            *(Path(e.shard).name for e in manifest.entries.values()),
        ]  # the manifest's: shards on other nodes
        self._base = max([int(n[1:]) for n in names if n[:1] == "s" and n[1:].isdigit()], default=-1) + 1
        self._named: set[str] = set()

    def name(self, number: int) -> str:
        """The shard of the pool's actor ``number`` (relative to the run directory, or absolute under ``shard_dir``)."""
        name = f"s{self._base + number:03d}"
        return f"{SHARDS_DIR}/{name}" if self.root is None else str(self.root / name)

    def setup(self, handle, number: int) -> None:
        """Tell a new actor its shard (it runs this before its ``ready()``)."""
        shard = self.name(number)
        where = shard if self.root is not None else str((self.manifest.run_dir / shard).resolve())
        handle.record_to.remote(where, shard, self.manifest.formats, self.env_meta)

    def episodes(
        self,
        pool: ActorPool,
        todo: Iterable[int | tuple[int, int]],
        subscribers: Sequence[Subscriber] = (),
        max_tries: int = MAX_TRIES,
    ) -> Iterator[EpisodeEnd]:
        """Run episodes ``todo`` (indices, or ``(index, seed)``) on ``pool``'s actors, each recorded in its actor's shard; yield each end once its manifest line is written.

        The end carries the light record (no camera frames), emitted to ``subscribers`` after the manifest line.
        """
        self.check_visible(pool)
        specs = episode_specs(todo, pool.config)
        if pool.envs > 1:  # N envs per actor: a call runs several episodes, each recorded and answered as it ends
            answers = (a for _, a in stream_batches(pool, specs, max_tries, recorded=True))
        else:
            call = lambda handle, ep: handle.run_recorded.remote(ep.index, ep.seed, ep.config)  # noqa: E731
            answers = (a for _, a in pool.map(call, specs, lambda ep: ep.index, max_tries))
        for light, receipt in answers:
            self.manifest.add(receipt["index"], receipt["digest"], receipt["shard"], receipt["node"])
            self._named.add(receipt["shard"])
            yield replace(emit(light, subscribers), record=None)
        self.say_where()

    def say_where(self) -> None:
        """With ``shard_dir``: one line on stderr when shards of this run are not on this machine (their nodes have them)."""
        away = sorted(s for s in self._named if not Path(s).is_dir())
        if self.root is not None and away:
            print(f"rollcap: {len(away)} shard(s) of this run are under {self.root} on other nodes ({', '.join(Path(s).name for s in away)}): copy them back "
                  f"to that path here, or into one directory for `rollcap merge {self.manifest.run_dir} --from DIR`", file=sys.stderr)  # fmt: skip

    def check_visible(self, pool: ActorPool) -> None:
        """One line on stderr for each node whose actors do not see the run directory (no shared filesystem there)."""
        blind = sorted({s.info["node"] for s in pool.slots if s.live and s.info.get("sees_run") is False})
        for node in blind:
            print(f"rollcap: the actors on node {node} do not see {self.manifest.run_dir} (no shared filesystem): their shards stay "
                  f"under that path on that node; copy them into {self.manifest.run_dir / SHARDS_DIR} before reading the run", file=sys.stderr)  # fmt: skip
