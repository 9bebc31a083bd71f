"""``rollcap.run``: what ``rollcap run`` does, as one Python call.

Builds (or takes) the env, policy and critic, records every episode on a
background writer (npz and robomimic HDF5), shows progress, writes
``summary.json``, resumes an interrupted run, and closes everything it built,
Ctrl-C included. The CLI's ``run`` is a thin layer over :func:`run`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollcap.kernels.files import atomic_write, cannot_create_dir, canonical_json, plain_json
from rollcap.rollout.build import DEFAULT_ENV, Parts, make_critic, make_env, make_runners
from rollcap.rollout.errors import ClusterFailure, ConfigError, NotExactWarning, RecordingFailed
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.subscribers import InBackground, Metrics, OneInterrupt, Progress

FORMATS = ("npz", "h5")


@dataclass(frozen=True)
class RunConfig:
    """How many episodes, and where and how they are recorded."""

    episodes: int = 10
    """Episodes in the run (with resume: the run's total, finished ones included)."""
    out: Path | None = None
    """Run directory (default: runs/<timestamp>, with runs/latest pointing at it)."""
    formats: tuple[str, ...] = FORMATS
    """Recording formats, a comma list of npz,h5."""
    resume: bool = False
    """Continue an interrupted run in out: run the episodes it lacks."""
    progress: bool = True
    """Show a progress bar."""
    actors: int = 0
    """Run the episodes on this many Ray actors (0: in this process, without Ray; with envs N, each actor drives N envs on one graph); needs pip install 'rollcap[ray]'."""
    address: str | None = None
    """With actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only); a head with token auth takes the token from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    actor_cpus: float = 1.0
    """With actors: CPUs reserved per actor."""
    actor_gpus: float | None = None
    """With actors: GPU share per actor, e.g. 0.5 (default: 0 on cpu; with a cuda device 1/actors, all on one GPU)."""
    shards: bool = True
    """With actors: each actor records its own shard of the run dir and this process writes only manifest.jsonl (every command reads it as one run; rollcap merge RUN makes one file); false: actors send episodes here to be recorded."""
    shard_dir: Path | None = None
    """With actors and shards, for a cluster without a shared filesystem: each actor writes its shard to PATH/<run name>/sNNN on its own node (a PATH every node has); the manifest names each shard's path and node; copy them back, then rollcap merge RUN [--from DIR]."""
    teleop: str | None = None
    """A person in the loop: keys from keyboard (X, else the terminal), terminal or scripted:FILE; a live view; the reset waits for the go key."""
    require_exact: bool = False
    """Refuse an env whose episodes cannot replay byte for byte (not repeatable, or no exact state) instead of warning and recording anyway."""
    envs: int = 1
    """Envs stepped in lockstep by one policy graph and one critic graph captured at this batch (each env its own episodes; the batch is in the fingerprint, so an episode replays at its batch); with actors: the envs of each actor, which runs several episodes per call (the same bytes as in this process)."""
    graphs: int = 1
    """With envs: split them over this many policy and critic graphs, each at batch envs/graphs on its own lanes (on CPU, one per core runs the batches side by side)."""
    writers: int = 0
    """Recording processes: 0 writes on a thread of this process; N >= 1 in N child processes, each a shard of the run (read as one run; rollcap merge RUN makes one file), for more episodes a second than one thread keeps up with (a GPU box: about 2 per 100 episodes/s)."""
    env_workers: int = 0
    """With envs N: step the N envs in this many worker processes (each records its episodes in its own shard of the run) while this process runs only the batched graphs; for a machine whose cores idle while one process steps every env (a GPU box: about one per core). 0: every env in this process. The same bytes either way."""

    def __post_init__(self):
        if not isinstance(self.episodes, int) or isinstance(self.episodes, bool) or self.episodes < 1:
            raise ConfigError("episodes", f"expected an integer >= 1, got {self.episodes!r}")
        if not isinstance(self.envs, int) or isinstance(self.envs, bool) or not 1 <= self.envs <= 1024:
            raise ConfigError("envs", f"expected an integer in 1..1024, got {self.envs!r}")
        if (
            not isinstance(self.graphs, int)
            or isinstance(self.graphs, bool)
            or self.graphs < 1
            or self.envs % self.graphs
        ):
            raise ConfigError(
                "graphs", f"expected an integer >= 1 that divides envs ({self.envs}), got {self.graphs!r}"
            )
        if not isinstance(self.writers, int) or isinstance(self.writers, bool) or not 0 <= self.writers <= 64:
            raise ConfigError("writers", f"expected an integer in 0..64, got {self.writers!r}")
        if self.writers and self.actors:
            raise ConfigError("writers", "with actors each actor records its own shard already; drop `writers`")
        w, other = (
            self.env_workers,
            "actors" if self.actors else "writers" if self.writers else "teleop" if self.teleop else None,
        )
        if not isinstance(w, int) or isinstance(w, bool) or w < 0 or (w and (self.envs < 2 or w > self.envs)):
            raise ConfigError("env_workers", f"expected an integer in 0..envs (envs >= 2; here {self.envs}), got {w!r}")
        if w and other:
            raise ConfigError("env_workers", f"each env worker records its own shard in this run; drop `{other}`")
        if self.envs > 1 and self.teleop is not None:
            raise ConfigError("envs", f"a batched run (envs={self.envs}) runs without a person; drop `teleop`")
        if not isinstance(self.actors, int) or isinstance(self.actors, bool) or self.actors < 0:
            raise ConfigError("actors", f"expected an integer >= 0, got {self.actors!r}")
        if self.teleop is not None and self.actors:
            raise ConfigError("teleop", "a person drives one episode at a time in this process; drop `actors`")
        if self.teleop is not None and not (
            self.teleop in ("keyboard", "terminal") or self.teleop.startswith("scripted:")
        ):
            raise ConfigError("teleop", f"expected keyboard, terminal or scripted:FILE, got {self.teleop!r}")
        if self.address is not None and not self.actors:
            raise ConfigError("address", f"joining a Ray cluster ({self.address}) needs actors (`actors=N`, N >= 1)")
        if not (_is_number(self.actor_cpus) and 0 < self.actor_cpus < float("inf")):
            raise ConfigError("actor_cpus", f"expected a finite number > 0, got {self.actor_cpus!r}")
        if self.actor_gpus is not None and not (_is_number(self.actor_gpus) and 0 <= self.actor_gpus < float("inf")):
            raise ConfigError("actor_gpus", f"expected a finite number >= 0, got {self.actor_gpus!r}")
        formats = (self.formats,) if isinstance(self.formats, str) else tuple(self.formats)
        if not formats or set(formats) - set(FORMATS) or len(set(formats)) != len(formats):
            raise ConfigError(
                "formats",
                f"expected a list of {','.join(FORMATS)} without repeats, got {','.join(map(str, formats)) or 'nothing'}",
            )
        object.__setattr__(self, "formats", formats)
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        if self.shard_dir is not None and not (self.actors and self.shards):
            raise ConfigError(
                "shard_dir",
                "per-node shard directories are for runs on actors that record shards (`actors=N`, not `shards=False`)",
            )


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass
class RunResult:
    """What :func:`run` returns (and what an interrupted run carries)."""

    run_dir: Path
    summary: dict
    """Success rate, stop reasons, latencies, wall time (also in ``run_dir/summary.json``). Episodes that ended
    unrecorded: ``dropped`` counts them all; ``discarded_by_key`` lists those a person discarded (teleop's
    discard key), ``unwritten_at_interrupt`` those finished but dropped from the writer's queue by a second Ctrl-C."""
    episodes: list[EpisodeEnd] = field(default_factory=list)
    """This session's episodes (outcomes; records are on disk: :meth:`records`)."""
    interrupted: bool = False

    def records(self):
        """Read every recorded episode of the run back from disk (verified)."""
        from rollcap.rollout.recording import load_any

        return load_any(self.run_dir)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run`; every finished episode was written first. ``result`` says what was kept."""

    def __init__(self, result: RunResult, cause: BaseException | None = None):
        super().__init__(f"interrupted: {result.summary['episodes']} whole episode(s) kept in {result.run_dir}")
        self.result = result
        self.cause = cause
        """The KeyboardInterrupt (or subclass, e.g. a SIGTERM translated by the CLI) that stopped the run."""


def run(
    episodes: int = 10,
    *,
    out: str | Path | None = None,
    env=DEFAULT_ENV,
    policy=None,
    critic=None,
    subscribers: tuple[Subscriber, ...] = (),
    on_started: Callable[[], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    poll_stop: Callable[[], None] | None = None,
    **options,
) -> RunResult:
    """Run and record episodes, as ``rollcap run`` does.

    Args:
        episodes: how many (with ``resume=True``: the run's total).
        out: the run directory (default ``runs/<timestamp>``).
        env: a gymnasium env id or an env instance.
        policy: a checkpoint path (default: the shipped policy) or a
            :class:`~rollcap.rollout.protocols.ChunkPolicy` object.
        critic: a checkpoint path (default: the shipped critic when the
            policy is a checkpoint), a :class:`~rollcap.rollout.protocols.ChunkCritic`,
            or ``"none"``.
        subscribers: more subscribers (a live view, your metrics). With
            ``actors``, they see each episode's start, chunks and end replayed
            from its record on this process (no steps: those ran on the actor).
        on_started: called once start-up is over (parts built, actors ready),
            just before the first episode (the CLI acts on a Ctrl-C it held
            during start-up there).
        on_finished: called once every episode is written and ``summary.json``
            is, while a signal is still only noted (the CLI stops raising on
            Ctrl-C there: what is left is closing, and an exception raised into
            a finaliser would print a traceback).
        poll_stop: called at safe points of start-up (after each part is
            built, before Ray starts, while actors build); it raises to stop
            there (the CLI acts on a Ctrl-C it holds, instead of at the end
            of start-up).
        **options: fields of :class:`HostConfig` (``seed``, ``critic_threshold``,
            ``max_chunks``, ...), :class:`RunConfig` (``formats``, ``resume``,
            ``progress``, ``actors``, ``address``, ...) and :class:`Parts`
            (``env_kwargs``, ``device``, ``backend``, ``threads``). With
            ``envs=N`` N envs share one policy and critic graph captured at batch
            N (:mod:`rollcap.rollout.batch`; ``env`` an id, the models
            checkpoints). With ``actors=N`` the episodes run on N Ray actors
            (:mod:`rollcap.rollout.ray.actors`), each building the env and
            runners from ``env`` and the checkpoint paths; this process checks
            them, then records what the actors return. With both, each actor drives
            ``envs`` envs at that batch (:mod:`rollcap.rollout.ray.batched`).

    Raises:
        ConfigError: a bad option (naming its field), before anything is created.
        Interrupted: Ctrl-C; finished episodes are kept (``.result``).
    """
    host_cfg, run_cfg, parts = _configs(episodes, out, env, policy, critic, options)
    if run_cfg.out is not None and (why := cannot_create_dir(run_cfg.out)):
        raise ConfigError("out", why)  # before minutes of building what would write there
    if run_cfg.actors:
        from rollcap.rollout.ray.actors import check_actor_run

        check_actor_run(
            env, policy, critic, run_cfg.address
        )  # names and paths only, Ray installed, something answers at the address
    poll = poll_stop or (lambda: None)
    own = []  # what this call built, and so closes
    workers = None
    try:
        if run_cfg.env_workers:  # ------ the N envs in worker processes (rollcap.rollout.workers), recording shards
            from rollcap.rollout.workers.run import worker_parts

            workers, env = worker_parts(env, policy, critic, parts, host_cfg, run_cfg, own, poll, check_repeatable)
            policy, critic = workers.policy, workers.critic
            built = critic
        elif run_cfg.envs > 1:  # N envs over one graph at batch N (rollcap.rollout.batch)
            from rollcap.rollout.batch import batched_parts

            env, policy, critic = batched_parts(
                env, policy, critic, parts, host_cfg, run_cfg, own, poll, check_repeatable
            )
            built = critic
        else:
            if isinstance(env, str):
                env = make_env(parts.env_id, parts.env_kwargs)
                own.append(env)
                poll()
            check_repeatable(env, run_cfg.require_exact)
            if _is_path(policy):
                policy, built = make_runners(parts, env, rtc=host_cfg.chunking != "sync")
                own += [policy, built]
            else:
                built = make_critic(parts, env) if parts.critic is not None else None
                own.append(built)
        critic = built if critic is None or _is_path(critic) else critic
        poll()
        return _record(
            env,
            policy,
            critic,
            host_cfg,
            run_cfg,
            list(subscribers),
            parts if run_cfg.actors else None,
            on_started,
            on_finished,
            poll,
            workers,
        )
    finally:
        for part in own:
            if part is not None:
                part.close()


def check_repeatable(env, require: bool = False) -> None:
    """Warn (:class:`NotExactWarning`) about an env that is not repeatable; with ``require``, refuse it, or one without exact state.

    :func:`rollcap.envs.probe_exactness` runs a seeded reset and a few steps
    twice on a copy of the env (the live env is left as it was) and looks for
    its exact state. An env that is repeatable but has no exact state (a
    plain gymnasium env) records without a warning: its episodes replay from
    the seed, and replay says which modes it could not check. Before anything
    is created.

    Raises:
        ConfigError: ``require`` and the env is not repeatable or not exact (naming ``require_exact``).
    """
    from rollcap.envs import probe_exactness

    verdict = probe_exactness(env)
    if verdict.repeatable is not False and (verdict.exact or not require):
        return
    why = f"{verdict.env_name}: {verdict.reason}; its recordings will not replay exactly"
    if require:
        raise ConfigError("require_exact", why)
    warnings.warn(why, NotExactWarning, stacklevel=3)


def _is_path(x) -> bool:
    return x is None or isinstance(x, (str, os.PathLike))


def _configs(episodes, out, env, policy, critic, options) -> tuple[HostConfig, RunConfig, Parts]:
    groups = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (HostConfig, RunConfig, Parts)}
    unknown = sorted(set(options) - set().union(*groups.values()) - {"env_id", "policy", "critic"})
    if unknown or {"env_id", "episodes", "out"} & set(options):
        bad = unknown or sorted({"env_id", "episodes", "out"} & set(options))
        raise TypeError(f"run(): unexpected option(s) {bad}; options are the fields of HostConfig, RunConfig and Parts")
    pick = {cls: {k: v for k, v in options.items() if k in names} for cls, names in groups.items()}
    parts_kw = pick[Parts]
    if isinstance(env, str):
        parts_kw["env_id"] = env
    if isinstance(policy, (str, os.PathLike)):
        parts_kw["policy"] = Path(policy)
    elif policy is not None:  # a policy object runs as it is: a setting of rollcap's own graphs would be ignored
        for name, plain in (("sampler", "plain"), ("precision", "fp32")):
            if parts_kw.get(name, plain) != plain:
                raise ConfigError(
                    name, f"{parts_kw[name]!r} applies to rollcap's checkpoints; a policy object runs as it is"
                )
    if isinstance(critic, (str, os.PathLike)):
        parts_kw["critic"] = Path(critic)
    elif critic is not None or not _is_path(policy):  # a critic object, or a user's policy: no shipped critic
        parts_kw["critic"] = None
    return HostConfig(**pick[HostConfig]), RunConfig(episodes=episodes, out=out, **pick[RunConfig]), Parts(**parts_kw)


def _record(
    env,
    policy,
    critic,
    host_cfg: HostConfig,
    cfg: RunConfig,
    extra: list[Subscriber],
    parts: Parts | None = None,
    on_started=None,
    on_finished=None,
    poll_stop=None,
    workers=None,
) -> RunResult:
    from rollcap.rollout.recording import EpisodeRecorder

    out = cfg.out or new_run_dir(Path("runs"))
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not cfg.resume:
        raise ConfigError(
            "out", f"{out}: directory is not empty (`resume=True` continues that run; or choose another `out`)"
        )
    from rollcap.rollout.recording import EPISODES_DIR, H5_NAME
    from rollcap.rollout.recording.shards import MANIFEST, SHARDS_DIR, is_sharded

    for name, want_dir in (
        (EPISODES_DIR, True),
        (H5_NAME, False),
        ("summary.json", False),
        (MANIFEST, False),
        (SHARDS_DIR, True),
    ):
        p = out / name
        if p.exists() and p.is_dir() != want_dir:
            raise ConfigError(
                "out",
                f"{p} is a {'file' if want_dir else 'directory'}, expected a {'directory' if want_dir else 'file'}; not a rollcap run directory",
            )
    envs, env = (env, env[0]) if isinstance(env, list) else (None, env)  # a list: a batched run's envs
    env_id = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
    env_meta = {
        "env_name": env_id,
        "type": 2,
        "env_kwargs": dict(env.spec.kwargs or {}) if getattr(env, "spec", None) else {},
    }
    sharded = workers is not None or (parts is not None and (cfg.shards or is_sharded(out)))  # stays sharded
    if parts is None and is_sharded(out) and not cfg.writers and workers is None:
        raise ConfigError(
            "actors",
            f"{out} is a sharded run ({MANIFEST}): resume it with actors, writers or env workers, or run `rollcap merge {out}` first",
        )
    before_setup = set(out.iterdir()) if out.is_dir() else None  # None: this call creates the directory
    if sharded:  # the actors write their shards; this process writes the manifest (no writer thread: nothing to write)
        from rollcap.rollout.recording.shards import ManifestWriter

        recorder = writer = ManifestWriter(out, cfg.formats, env_meta, resume=cfg.resume)
    elif cfg.writers:  # child processes, each recording a shard: their CPU and GIL leave this process
        from rollcap.rollout.recording.process import WriterPool

        writer = WriterPool(out, cfg.writers, cfg.formats, env_meta, resume=cfg.resume)
        recorder = writer.manifest
    else:
        recorder = EpisodeRecorder(out, formats=cfg.formats, env_meta=env_meta, resume=cfg.resume)
        writer = InBackground(recorder)  # episodes are written on a writer thread, off the hot path
    earlier = recorder.verify() if cfg.resume else []  # every finished episode is read back before appending
    before = set(recorder.indices)
    todo = [i for i in range(cfg.episodes) if i not in before]
    metrics = Metrics()
    subs: list[Subscriber] = [metrics, *extra] if sharded else [writer, metrics, *extra]
    if cfg.progress and parts is None:
        subs.append(Progress(len(todo)))
    pool = tele = shards = None
    try:
        if cfg.teleop is not None:  # keys, status and live view around one event bus; the reset waits for go
            from rollcap.rollout.teleop import TeleopConfig, open_teleop

            tele = open_teleop(TeleopConfig(source=cfg.teleop)).__enter__()
        if workers is not None:  # env workers: each records its shard; this process names the episodes in the manifest
            workers.record_to(recorder, env_meta, subs)
            host = workers
        elif envs is not None:
            from rollcap.rollout.batch import BatchedCore

            host = BatchedCore(envs, policy, critic, host_cfg, subs)
        else:
            host = RolloutHost(
                env,
                policy,
                critic,
                host_cfg,
                subs + (tele.subscribers if tele else []),
                events=tele.bus if tele else None,
                reset_hook=tele.reset_hook if tele else None,
            )
        if earlier:
            _same_run(earlier[0], host, env, env_meta, cfg.graphs, elsewhere=bool(cfg.actors))
        if parts is not None:  # Ray actors run the episodes; this process records what they return
            from rollcap.rollout.ray.actors import ActorPool

            if sharded:
                from rollcap.rollout.ray.shards import Shards

                shards = Shards(recorder, env_meta, cfg.shard_dir)
            run_cfg = dataclasses.replace(cfg, out=out)  # the run's directory: Ray's own messages go to a file there
            pool = ActorPool.for_run(parts, host, run_cfg, setup=shards and shards.setup, poll_stop=poll_stop)
            if cfg.progress:  # the bar starts once the actors are up: its rate is the episodes'
                subs.append(Progress(len(todo)))
        if on_started is not None:
            on_started()
    except BaseException:
        if pool is not None:
            pool.close()
        if tele is not None:
            tele.__exit__(None, None, None)
        writer.close()
        lost = isinstance(sys.exc_info()[1], ClusterFailure)  # the machines failed: the run keeps Ray's log (ray.log)
        if not recorder.indices and not lost:  # nothing recorded, ever: leave no trace of this call
            _remove_new(out, before_setup)  # (a bad option is found here)
        raise
    ends: list[EpisodeEnd] = []
    t0 = time.perf_counter()
    interrupted, failure = None, None
    with OneInterrupt(writer) as guard:
        try:
            if shards is not None:
                episodes = shards.episodes(pool, todo, subs)
            elif pool is not None:
                episodes = pool.episodes(todo, subs)
            elif tele is not None:
                episodes = _with_person(
                    host,
                    todo,
                    tele,
                    _rewinds(host),
                    itertools.count(max(before | set(range(cfg.episodes)), default=-1) + 1),
                )
            elif envs is not None or workers is not None:
                episodes = host.episodes(todo)
            else:
                episodes = (host.run_episode(i) for i in todo)
            for end in episodes:
                ends.append(
                    dataclasses.replace(end, record=None)
                )  # the writer thread owns the record; keep outcomes only
        except KeyboardInterrupt as stop:
            interrupted = stop
        except RecordingFailed as err:
            failure = err
        finally:
            guard.live = (
                False  # first statement (no call): from here a signal is noted, never raised, so the drain ends
            )
            host.abort()
            if tele is not None:
                tele.__exit__(None, None, None)  # the key source stops, the terminal is restored
            if pool is not None:
                pool.close()  # actors stop; an episode still running on one is not recorded
            try:
                writer.close()  # every finished episode is written (after a second signal: only the one being written)
            except RecordingFailed as err:
                failure = failure or err
            for s in subs:
                if s is not writer:  # closed above
                    s.on_run_end()
        kept = set(recorder.indices) - before
        interrupted = (
            interrupted or guard.caught
        )  # a signal during the drain: every episode is kept, the run still says interrupted
        summary = metrics.summary(only=kept, earlier=[Metrics.row(r) for r in earlier])
        summary.update({
            "wall_s": time.perf_counter() - t0, "run_dir": str(out), "interrupted": interrupted is not None,
            "discarded_by_key": [e.index for e in ends if e.dropped and e.error is None],  # teleop's r: not recorded, re-run
            "unwritten_at_interrupt": writer.discarded,  # finished, still queued at a second Ctrl-C: not written
        })  # fmt: skip
        for source in (pool, workers):
            if source is not None:
                summary.update(source.summary())
        if sharded:
            summary["shards"] = len(
                set(recorder.shard_names())
                | {Path(e.shard).name for e in recorder.entries.values() if Path(e.shard).is_absolute()}
            )
        if failure is not None:
            summary["recording_failed"] = str(failure)
        try:
            atomic_write(out / "summary.json", lambda tmp: Path(tmp).write_text(canonical_json(summary, indent=2)))
        except OSError as err:  # e.g. the disk that filled up: the episodes are what matters
            failure = failure or RecordingFailed(f"{out / 'summary.json'}: not written ({err.strerror or err})")
        interrupted = interrupted or guard.caught
        if on_finished is not None:
            on_finished()
    result = RunResult(out, summary, [e for e in ends if e.index in kept], interrupted is not None)
    if failure is not None:
        raise RecordingFailed(f"{failure}; {len(kept)} whole episode(s) of this session kept in {out}") from failure
    if interrupted is not None:
        raise Interrupted(result, interrupted)
    return result


def _remove_new(out: Path, before: set | None) -> None:
    """Remove what set-up created in ``out``: the whole directory if it did not exist, else the entries it added."""
    import shutil

    for p in [out] if before is None else sorted(set(out.iterdir()) - before):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _with_person(host: RolloutHost, todo: list[int], tele, rewind=None, spare=None):
    """Episodes with a person in the loop: a discarded one is re-recorded under its index; quit ends the run after the episode.

    A rewound episode (the rewind key) is kept as it ran; its retry, from the boundary before the chunk that
    was running, is recorded under the next ``spare`` index (after the run's own), and may be rewound again.
    """
    for i in todo:
        while True:
            end = host.run_episode(i)
            yield end
            if not end.dropped or tele.quit_requested:
                break
        while rewind is not None and end.stop_reason == "rewind" and rewind.kept and not tele.quit_requested:
            from rollcap.rollout.seeding import retry_seed

            at = rewind.resume_requested()
            end = host.run_episode(next(spare), retry_seed(end.seed, at.chunk, rewind.attempts), at)
            yield end
        if tele.quit_requested:
            return


def _rewinds(host: RolloutHost):
    """The teleop rewind buffer (the last 8 boundaries), or None for an env without exact state."""
    if host.state_env is None:
        return None
    from rollcap.rollout.offline.rewind import RewindBuffer

    return RewindBuffer.on(host)


def _same_run(recorded, host, env, env_meta: dict, graphs: int, elsewhere: bool = False) -> None:
    """Refuse to resume a run with another deployment (:func:`rollcap.rollout.resume.check_same_run`); ``env``: one
    of the run's envs in this process (a host's, a batch's first, the env workers' local copy)."""
    from rollcap.envs import exact_state_of
    from rollcap.rollout.lifecycle import fingerprints_of
    from rollcap.rollout.resume import check_same_run

    fps = fingerprints_of(host.policy, host.critic, exact_state_of(env))
    now = plain_json(dataclasses.asdict(host.config))
    check_same_run(recorded, now, fps, env_meta["env_name"], env_meta["env_kwargs"], graphs, elsewhere)


def new_run_dir(root: Path) -> Path:
    """``runs/<timestamp>`` (suffixed if taken), with ``runs/latest`` pointing at it."""
    base = root / time.strftime("%Y%m%d-%H%M%S")
    out, n = base, 1
    while out.exists():
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    out.mkdir(parents=True)
    latest = root / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            tmp = root / f".latest-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(out.name)
            os.replace(tmp, latest)
    except OSError:  # e.g. a filesystem without symlinks: the link is a convenience only
        pass
    return out
