"""``rollcap.run``: what ``rollcap run`` does, as one Python call.

A run is a pipeline: its spec (:class:`~rollcap.rollout.spec.Spec`, from the
arguments), the build (:func:`~rollcap.rollout.build.build`: envs and runners
at the run's batch), its placement (:func:`placement_for`: where its slots live,
each running the same round: this process, env workers, Ray actors, or a
person's hands), the sink its episodes are recorded in
(:func:`~rollcap.rollout.recording.sinks.open_sink`: a writer thread, writer
processes, or the manifest of the shards the placement writes) and the summary. It shows progress, writes
``summary.json``, resumes an interrupted run, and closes everything it built,
Ctrl-C included. The CLI's ``run`` is a thin layer over :func:`run`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rollcap.envs import exact_state_of
from rollcap.envs.adapters import env_name
from rollcap.kernels.files import cannot_create_dir, plain_json, write_report
from rollcap.rollout.build import Built, build, for_this_machine
from rollcap.rollout.errors import ClusterFailure, ConfigError, RecordingFailed
from rollcap.rollout.lifecycle import fingerprints_of
from rollcap.rollout.offline.deployment import check_same_run
from rollcap.rollout.offline.branching import branch_recorded
from rollcap.rollout.protocols import EpisodeEnd, Subscriber
from rollcap.rollout.ray.actors import ActorPool
from rollcap.rollout.ray.episodes import identity, check_actor_run
from rollcap.rollout.ray.branch import BranchActor
from rollcap.rollout.recording import EPISODES_DIR, H5_NAME, load_any
from rollcap.rollout.recording.shards import MANIFEST, SHARDS_DIR
from rollcap.rollout.recording.sinks import open_sink
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.placement import InProcess, Placement
from rollcap.rollout.ray.placement import ActorsPlacement
from rollcap.rollout.teleop.placement import TeleopPlacement
from rollcap.rollout.workers.core import EnvWorkersPlacement
from rollcap.rollout.spec import Spec
from rollcap.rollout.subscribers import Metrics, OneInterrupt, Progress


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
        return load_any(self.run_dir)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run`; every finished episode was written first. ``result`` says what was kept."""

    def __init__(self, result: RunResult, cause: BaseException | None = None):
        super().__init__(f"interrupted: {result.summary['episodes']} whole episode(s) kept in {result.run_dir}")
        self.result = result
        self.cause = cause
        """The KeyboardInterrupt (or subclass, e.g. a SIGTERM translated by the CLI) that stopped the run."""


def run(
    spec: Spec | int | None = None,
    /,
    *,
    subscribers: tuple[Subscriber, ...] = (),
    on_started: Callable[[], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    poll_stop: Callable[[], None] | None = None,
    **options,
) -> RunResult:
    """Run and record episodes, as ``rollcap run`` does: build, placement, rounds, summary.

    ``rollcap.run(spec)`` runs a :class:`~rollcap.rollout.spec.Spec` (what ``rollcap run`` hands over);
    ``rollcap.run(episodes, out=..., env=..., policy=..., critic=..., **options)`` is the door for keywords
    (:meth:`Spec.of <rollcap.rollout.spec.Spec.of>` makes the spec of them).

    Args:
        spec: the run, or how many episodes (with ``resume=True``: the run's total; default 10).
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
        **options: without a spec, ``episodes``, ``out`` (the run directory; default ``runs/<timestamp>``),
            ``env`` (an env id or an env object), ``policy`` (a checkpoint path, default the shipped
            policy, or a :class:`~rollcap.rollout.protocols.ChunkPolicy` object), ``critic`` (a
            checkpoint path, default the shipped critic when the policy is a checkpoint, a
            :class:`~rollcap.rollout.protocols.ChunkCritic`, or ``"none"``) and the fields of :class:`HostConfig` (``seed``, ``critic_threshold``,
            ``max_chunks``, ...), :class:`RunConfig` (``formats``, ``resume``,
            ``progress``, ``actors``, ``address``, ...) and :class:`Parts`
            (``env_kwargs``, ``device``, ``backend``, ``threads``). With
            ``envs=N`` N envs share one policy and critic graph captured at batch
            N (:mod:`rollcap.rollout.batch`; ``env`` an id, the models
            checkpoints). With ``actors=N`` the episodes run on N Ray actors
            (:mod:`rollcap.rollout.ray.actors`), each building the env and
            runners from ``env`` and the checkpoint paths; this process checks
            them, then records what the actors return. With both, each actor drives
            ``envs`` envs at that batch (:func:`~rollcap.rollout.ray.actors.stream_batches`).

    Raises:
        ConfigError: a bad option (naming its field), before anything is created.
        Interrupted: Ctrl-C; finished episodes are kept (``.result``).
        TypeError: options beside a spec, or an option no section has.
    """
    if not isinstance(spec, Spec):
        spec = Spec.of(**({} if spec is None else {"episodes": spec}), **options)
        chose = "env_workers" in options
    elif options:
        raise TypeError(f"run(spec): the spec holds the whole run; got options beside it: {sorted(options)}")
    else:
        chose = spec.run.env_workers != "auto"
    spec = for_this_machine(spec)  # env_workers="auto": a count
    if subscribers and spec.run.env_workers and not chose:  # the default put the envs elsewhere
        warnings.warn(
            f"rollcap.run: envs={spec.run.envs} step on {spec.run.env_workers} env worker(s) (env_workers auto): your "
            "subscribers see each episode's start, its chunks' values and timings and its end, not its observations; "
            "pass env_workers=0 to step every env in this process",
            stacklevel=2,
        )
    if spec.run.out is not None and (why := cannot_create_dir(spec.run.out)):
        raise ConfigError("out", why)  # before minutes of building what would write there
    if spec.run.actors:  # names and paths only, Ray installed, something answers at the address
        check_actor_run(spec.deployment, spec.run.address)
    poll = poll_stop or (lambda: None)
    built = build(spec, poll)  # what it made, this call closes
    try:
        return _record(spec, built, list(subscribers), on_started, on_finished, poll)
    finally:
        built.close()


def branch_episode(
    file, episode: int | None = None, chunk: int = 0, n: int = 8, *, actors: int = 0, address=None, **options
):
    """``rollcap.branch``: branch episode ``episode`` of the recording ``file`` at ``chunk`` (what ``rollcap branch`` does).

    :func:`rollcap.rollout.offline.branching.branch_recorded` (its arguments, its returns); this door adds the Ray
    pool its ``actors`` run on (on a new local Ray, or the cluster at ``address``).
    """

    return branch_recorded(
        file, episode, chunk, n, actors=actors, address=address, pool_for=branch_pool(actors, address), **options
    )


def branch_pool(actors: int, address=None):
    """``pool_for(parts, host)``: the Ray pool of ``actors`` branch actors a recording's branches run on."""

    def pool_for(parts, host):
        check_actor_run(parts)
        return ActorPool(parts, host.config, actors, address, expect=identity(host), actor_cls=BranchActor)

    return pool_for


def placement_for(spec: Spec, built: Built, spare_from: int = 0) -> Placement:
    """Where ``spec``'s slots live (nothing starts yet): env workers, Ray actors, a person's hands, or this process.
    ``spare_from``: the first index a teleop retry may take (after the run's own)."""
    spec = for_this_machine(spec)  # env_workers "auto": a count
    run = spec.run
    if run.env_workers:
        return EnvWorkersPlacement(spec, built)
    if run.actors:
        return ActorsPlacement(spec, built)
    if run.teleop is not None:
        return TeleopPlacement(spec, built, spare_from)
    return InProcess(spec, built)


def _record(spec: Spec, built: Built, extra: list[Subscriber], on_started=None, on_finished=None, poll_stop=None):
    """Sink, placement, summary: the run's directory checked, episodes run and written, ``summary.json``."""
    cfg = spec.run
    out = cfg.out or new_run_dir(Path("runs"))
    _check_out(out, cfg.resume)
    env_meta = _env_meta(built.env)
    before_setup = set(out.iterdir()) if out.is_dir() else None  # None: this call creates the directory
    sink = open_sink(cfg, out, env_meta)
    recorder = sink.recorder
    earlier = recorder.verify() if cfg.resume else []  # every finished episode is read back before appending
    before = set(recorder.indices)
    todo = [(i, episode_seed(spec.host.seed, i)) for i in range(cfg.episodes) if i not in before]
    metrics = Metrics()
    subs: list[Subscriber] = [*sink.subscribers, metrics, *extra]
    if cfg.progress:  # drawn at the first episode: its rate is the episodes', not start-up's
        subs.append(Progress(len(todo)))
    spare = max(before | set(range(cfg.episodes)), default=-1) + 1
    here = dataclasses.replace(spec, run=dataclasses.replace(cfg, out=out))  # Ray's own messages: a file there
    placement = placement_for(here, built, spare)
    try:
        if (
            len(before) > cfg.episodes
        ):  # resumed with a smaller total: nothing would run, and the summary would say done
            raise ConfigError(
                "episodes",
                f"{out} holds {len(before)} episodes already; with `resume=True` it is the run's total: give at least {len(before)}",
            )
        if earlier:
            _same_run(earlier[0], placement, built.env, env_meta, cfg.graphs)
        placement.start(subs, sink.shards, poll_stop or (lambda: None))
        if on_started is not None:
            on_started()
    except BaseException:
        placement.close()
        sink.close()
        lost = isinstance(sys.exc_info()[1], ClusterFailure)  # the machines failed: the run keeps Ray's log (ray.log)
        if not recorder.indices and not lost:  # nothing recorded, ever: leave no trace of this call
            _remove_new(out, before_setup)  # (a bad option is found here)
        raise
    t0 = time.perf_counter()
    with OneInterrupt(sink.writer) as guard:
        ends, interrupted, failure = _drain(placement, sink, subs, todo, guard)
        kept = set(recorder.indices) - before
        interrupted = interrupted or guard.caught  # a signal during the drain: every episode is kept, still interrupted
        summary = metrics.summary(only=kept, earlier=[Metrics.row(r) for r in earlier])
        summary.update({
            "wall_s": time.perf_counter() - t0, "run_dir": str(out), "interrupted": interrupted is not None,
            "discarded_by_key": [e.index for e in ends if e.dropped and e.error is None],  # teleop's r: not recorded, re-run
            "unwritten_at_interrupt": sink.discarded,  # finished, still queued at a second Ctrl-C: not written
            "env_workers": cfg.env_workers,  # 0 too (`env_workers="auto"` may choose none); the workers' placement says more
        })  # fmt: skip
        summary.update(placement.summary())
        summary.update(sink.summary())
        failure = _write_summary(out, summary, failure)
        interrupted = interrupted or guard.caught
        if on_finished is not None:
            on_finished()
    result = RunResult(out, summary, [e for e in ends if e.index in kept], interrupted is not None)
    if failure is not None:
        raise RecordingFailed(f"{failure}; {len(kept)} whole episode(s) of this session kept in {out}") from failure
    if interrupted is not None:
        raise Interrupted(result, interrupted)
    return result


def _env_meta(env) -> dict:
    """The env metadata a run's recordings carry (robomimic's ``env_args``: name, type 2 = gym, kwargs)."""
    return {
        "env_name": env_name(env),
        "type": 2,
        "env_kwargs": dict(env.spec.kwargs or {}) if getattr(env, "spec", None) else {},
    }


def _drain(placement: Placement, sink, subs: list[Subscriber], todo: list, guard: OneInterrupt):
    """Run ``todo`` on the started placement until done, a Ctrl-C or a failed write; then close the placement (what
    runs is abandoned), the sink (every finished episode written) and the subscribers.
    Returns ``(ends, interrupted, failure)``: the episodes' outcomes (records dropped: the writer owns them), the
    KeyboardInterrupt caught or None, the RecordingFailed or None."""
    ends: list[EpisodeEnd] = []
    interrupted, failure = None, None
    try:
        for end in placement.episodes(todo):
            ends.append(dataclasses.replace(end, record=None))  # the writer owns the record; keep outcomes only
    except KeyboardInterrupt as stop:
        interrupted = stop
    except RecordingFailed as err:
        failure = err
    finally:
        guard.live = False  # first statement (no call): from here a signal is noted, never raised
        placement.close()  # what runs is abandoned (not recorded): actors stop, the terminal is restored
        try:
            sink.close()  # every finished episode is written (after a second signal: only the one being written)
        except RecordingFailed as err:
            failure = failure or err
        for s in subs:
            if s is not sink.writer:  # closed above
                s.on_run_end()
    return ends, interrupted, failure


def _write_summary(out: Path, summary: dict, failure: RecordingFailed | None) -> RecordingFailed | None:
    """``summary.json`` written (a failed write noted in it); returns the run's failure, this write's if none before."""
    if failure is not None:
        summary["recording_failed"] = str(failure)
    try:
        write_report(out / "summary.json", summary)
    except OSError as err:  # e.g. the disk that filled up: the episodes are what matters
        failure = failure or RecordingFailed(f"{out / 'summary.json'}: not written ({err.strerror or err})")
    return failure


def _check_out(out: Path, resume: bool) -> None:
    """Refuse a run directory that is a file, not empty without ``resume``, or not laid out as a run's."""
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not resume:
        raise ConfigError(
            "out", f"{out}: directory is not empty (`resume=True` continues that run; or choose another `out`)"
        )
    layout = ((EPISODES_DIR, True), (H5_NAME, False), ("summary.json", False), (MANIFEST, False), (SHARDS_DIR, True))
    for name, want_dir in layout:
        p = out / name
        if p.exists() and p.is_dir() != want_dir:
            raise ConfigError(
                "out",
                f"{p} is a {'file' if want_dir else 'directory'}, expected a {'directory' if want_dir else 'file'}; not a rollcap run directory",
            )


def _remove_new(out: Path, before: set | None) -> None:
    """Remove what set-up created in ``out``: the whole directory if it did not exist, else the entries it added."""
    for p in [out] if before is None else sorted(set(out.iterdir()) - before):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _same_run(recorded, placement: Placement, env, env_meta: dict, graphs: int) -> None:
    """Refuse to resume a run with another deployment (:func:`rollcap.rollout.offline.deployment.check_same_run`); ``env``: one
    of the run's envs in this process (a host's, a batch's first, the env workers' local copy)."""
    made = placement.identity
    fps = fingerprints_of(made.policy, made.critic, exact_state_of(env))
    now = plain_json(dataclasses.asdict(made.config))
    check_same_run(recorded, now, fps, env_meta["env_name"], env_meta["env_kwargs"], graphs, placement.elsewhere)


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
