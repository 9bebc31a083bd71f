"""Sinks: where a run's episodes are written, chosen from its spec.

```
thread     InBackground(EpisodeRecorder)  one writer thread of the driver (the default)
processes  WriterPool                     N child processes, each a shard of the run (``writers=N``)
shards     ManifestWriter                 whoever steps the envs writes its own shard (Ray actors,
                                          ``shards=True``); the driver appends the manifest only
```

A :class:`Sink` is where a placement's finished episodes go: its
``subscribers`` (the writer, or nothing when the envs' owners write) join the
run's subscribers, ``recorder`` knows which indices the run has (resume) and
``close()`` drains it. A new storage is one more branch of :func:`open_sink`;
a placement that records where it steps (env worker processes, Ray actors)
is given the ``shards`` sink's manifest (:attr:`Sink.shards`) and names each
episode's shard there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollcap.rollout.errors import ConfigError
from rollcap.rollout.recording.process import WriterPool
from rollcap.rollout.recording.recorder import EPISODES_DIR, H5_NAME, EpisodeRecorder
from rollcap.rollout.recording.shards import MANIFEST, ManifestWriter, is_sharded
from rollcap.rollout.spec import RunConfig
from rollcap.rollout.subscribers import InBackground


@dataclass
class Sink:
    """A run's storage: ``writer`` takes the episodes (``close()`` drains it); ``recorder`` knows the run's indices."""

    kind: str
    """``thread``, ``processes`` or ``shards`` (see the module docstring)."""
    recorder: object
    """:class:`EpisodeRecorder` or :class:`ManifestWriter`: ``indices``, ``verify()`` and the run's files."""
    writer: object
    """The subscriber that writes (the thread, the pool), or the manifest (``shards``: not a subscriber)."""

    @property
    def sharded(self) -> bool:
        return self.kind == "shards"

    @property
    def shards(self) -> ManifestWriter | None:
        """The run's manifest, where a placement that records where it steps names each episode (``shards``
        sinks only; None: the episodes come here and :attr:`subscribers` write them)."""
        return self.writer if self.sharded else None

    @property
    def subscribers(self) -> list:
        """What joins the run's subscribers: the writer, unless the envs' owners write their own shards."""
        return [] if self.sharded else [self.writer]

    @property
    def discarded(self) -> list[int]:
        """Episodes finished but dropped from the queue by a second Ctrl-C (not written)."""
        return self.writer.discarded

    def summary(self) -> dict:
        """What the run's summary says of the storage: a sharded run's shard count (here and on other nodes)."""
        if not self.sharded:
            return {}
        m = self.recorder
        return {
            "shards": len(
                set(m.shard_names()) | {Path(e.shard).name for e in m.entries.values() if Path(e.shard).is_absolute()}
            )
        }

    def close(self) -> None:
        """Write every finished episode (after a second signal: only the one being written)."""
        self.writer.close()


def open_sink(run: RunConfig, out: Path, env_meta: dict) -> Sink:
    """The sink ``run`` asks for in ``out``: the shards' manifest when the episodes are recorded where they are
    stepped (env workers; Ray actors unless ``shards=False``), else writer processes or the writer thread.

    A sharded run stays sharded on resume (its manifest says so).

    Raises:
        ConfigError: a sharded run resumed in this process without writers (naming ``actors``).
        ValueError: ``env_workers`` still "auto" (:func:`rollcap.rollout.build.for_this_machine` settles it first).
    """
    if run.env_workers == "auto":
        raise ValueError("open_sink: env_workers is still 'auto'; settle it for this machine first (for_this_machine)")
    if run.env_workers or (run.actors and (run.shards or is_sharded(out))):
        writer = ManifestWriter(out, run.formats, env_meta, resume=run.resume)
        return Sink("shards", writer, writer)
    if not run.actors and is_sharded(out) and not run.writers:
        raise ConfigError(
            "actors",
            f"{out} is a sharded run ({MANIFEST}): resume it with actors, writers or env workers, or run `rollcap merge {out}` first",
        )
    if run.writers:  # child processes, each recording a shard: their CPU and GIL leave this process
        pool = WriterPool(out, run.writers, run.formats, env_meta, resume=run.resume)
        return Sink("processes", pool.manifest, pool)
    if run.resume:
        _keeps_formats(out, run.formats)
    recorder = EpisodeRecorder(out, formats=run.formats, env_meta=env_meta, resume=run.resume)
    return Sink("thread", recorder, InBackground(recorder))  # written on a writer thread, off the hot path


def _keeps_formats(out: Path, formats: tuple[str, ...]) -> None:
    """Refuse to resume a run without a format it recorded (its later episodes would be missing from that format's files).

    Raises:
        ConfigError: naming ``formats``: what the run records, what was asked.
    """
    had = [f for f, there in (("npz", any((out / EPISODES_DIR).glob("episode_*.npz"))), ("h5", (out / H5_NAME).exists())) if there]  # fmt: skip
    if set(had) - set(formats):
        raise ConfigError(
            "formats", f"{out} records {','.join(had)}; `resume=True` needs the same formats, got {','.join(formats)}"
        )
