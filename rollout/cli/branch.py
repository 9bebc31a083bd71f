"""``rollcap branch``: branch a recorded episode at a chunk boundary (or calibrate the critic over many).

Wiring only: read the recording, build its env and the runners, a host with
the recording's config, then :func:`rollcap.rollout.offline.branch.run_branches` or
:func:`rollcap.rollout.offline.calibrate.calibrate`. The main CLI registers the
subcommand through :func:`add_parser`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXAMPLE = "rollcap branch runs/latest/episodes.hdf5 --episode 3 --chunk 5 --n 16 --out runs/branch3"
DESCRIPTION = (
    "Put a recorded episode (npz, HDF5 or run directory) back at the start of chunk K (its recorded actions re-applied "
    "in the env, no inference) and run N continuations with fresh noise seeds derived from (parent seed, K, branch), "
    "plus a control branch with the recorded noise, which must reproduce the original continuation byte for byte. "
    "Each branch is recorded as an episode (index = branch, 0 the control) with its lineage, so `rollcap replay` checks "
    "it alone. Prints the Monte-Carlo value at the boundary (mean critic target, success rate and return, 95% intervals) "
    "beside the critic's value; writes branch.json. With --calibrate: the same at every --every-th boundary of every "
    "episode, then correlation and error of critic vs Monte-Carlo value and a reliability plot (calibration.json, calibration.png)."
)


def add_parser(command, parts_options) -> None:
    """Register ``branch`` through the main CLI's ``command(name, func, help, description, example)``."""
    p = command(
        "branch",
        cmd_branch,
        "fork N continuations from a boundary of a recorded episode; Monte-Carlo values",
        DESCRIPTION,
        EXAMPLE,
    )
    p.add_argument("file", type=Path, help="npz file, HDF5 file or run directory holding the parent episode")
    p.add_argument(
        "--episode",
        type=int,
        default=None,
        help="the parent episode's index (default: the file's only or first episode)",
    )
    p.add_argument("--chunk", type=int, default=0, help="branch at the start of this chunk (0-based; default 0)")
    p.add_argument("--n", type=int, default=8, help="seeded branches per boundary, besides the control (default 8)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="derive the branch seeds from this instead of the parent's episode seed (another set of branches)",
    )
    p.add_argument("--no-control", action="store_true", help="skip the control branch (the recorded noise)")
    p.add_argument(
        "--actors", type=int, default=0, help="run the branches on this many Ray actors (default 0: in this process)"
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="new (or empty) directory for the branch recordings and branch.json (default: runs/branch-<episode>-<chunk>); with --calibrate, for calibration.json and .png (default: runs/calibration)",
    )
    p.add_argument(
        "--format", dest="formats", default="npz,h5", help="recording formats, a comma list of npz,h5 (default both)"
    )
    p.add_argument(
        "--env",
        default=None,
        help="allow the recording's env id (it must be the same); needed for a 'module:Env' id, which is never imported from a file otherwise; 'module:Env' also names a recording of Env",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="Monte-Carlo values at many boundaries: every --every-th chunk of every episode (or --episode); branches not recorded",
    )
    p.add_argument("--every", type=int, default=1, help="with --calibrate: every this many chunks (default 1)")
    p.set_defaults(options=parts_options(p, skip=("env_id", "env_kwargs"), as_recorded=True))


def _parent(path: Path, episode: int | None):
    from rollcap.rollout.errors import ConfigError
    from rollcap.rollout.recording import episodes_of

    items = episodes_of(path)
    for source, rec in items:
        if isinstance(rec, Exception):
            if episode is None or f"demo_{episode}" in source or f"episode_{episode:05d}" in source:
                raise rec
            continue
        if episode is None or rec.index == episode:
            return source, rec
    have = sorted(r.index for _, r in items if not isinstance(r, Exception))
    raise ConfigError("episode", f"{path}: no episode {episode} (it holds {have})")


def branch_episode(
    file,
    episode: int | None = None,
    chunk: int = 0,
    n: int = 8,
    *,
    seed: int | None = None,
    control: bool = True,
    out=None,
    formats=("npz", "h5"),
    actors: int = 0,
    parts=None,
    address: str | None = None,
    env: str | None = None,
):
    """Branch episode ``episode`` of the recording ``file`` at ``chunk``: the control and ``n`` seeded branches.

    What ``rollcap branch`` does, without argparse (``rollcap.branch``): every branch is recorded in
    ``out`` (default ``runs/branch-<episode>-<chunk>``, a new or empty directory) with ``branch.json``.
    ``parts``: a :class:`~rollcap.rollout.build.Parts` naming the checkpoints
    (its env is replaced by the recording's), or a dict of some of its fields (None or absent: the
    recording's device, backend, precision, policy and critic; the default). ``actors``: run the branches on
    that many Ray actors, on a new local Ray or the cluster at ``address``
    (the boundary is computed here; recordings land in ``out`` on this machine).
    ``env``: the recording's env id as you name it (see :func:`~rollcap.rollout.build.named_env`):
    needed for an env a module registers, which is never imported because a file names it.
    Returns ``(BranchResult, summary dict)``.

    Raises:
        ConfigError: a bad count, chunk, episode, ``out`` or env (one line naming the field), before anything is written.
    """
    from rollcap.kernels.files import atomic_write, canonical_json
    from rollcap.rollout.offline.branch import boundaries, run_branches
    from rollcap.rollout.errors import ConfigError
    from rollcap.rollout.recording import EpisodeRecorder

    for name, value, low in (("n", n, 0), ("chunk", chunk, 0), ("actors", actors, 0)):
        if value < low:
            raise ConfigError(name, f"expected an integer >= {low}, got {value}")
    _check_address(address, actors)
    if n == 0 and not control:
        raise ConfigError("n", "0 branches without the control runs nothing")
    if not formats or set(formats) - {"npz", "h5"}:
        raise ConfigError("formats", f"expected a comma list of npz,h5, got {','.join(formats)!r}")
    source, rec = _parent(Path(file), episode)
    if chunk >= rec.num_chunks:
        raise ConfigError("chunk", f"{chunk}: episode {rec.index} of {source} has chunks 0..{rec.num_chunks - 1}")
    out = Path(out) if out is not None else Path("runs") / f"branch-{rec.index}-{chunk}"
    _check_new_dir(out)
    with _Built(parts or {}, rec, source, actors, address, env) as (host, pool):
        at = boundaries(rec, host.env, [chunk], parent=str(source))[chunk]
        result = run_branches(host, rec, chunk, n, control=control, parent=str(source), at=at, pool=pool, seed=seed)
    with EpisodeRecorder(out, formats) as recorder:  # nothing is written before every branch has run
        for record in result.records:
            recorder.write(record)
    summary = {
        "parent": str(source),
        "episode": rec.index,
        "chunk": chunk,
        "step": at.origin["step"],
        "out": str(out),
        **result.summary(),
    }
    atomic_write(out / "branch.json", lambda tmp: Path(tmp).write_text(canonical_json(summary, indent=2)))
    return result, summary


def _check_new_dir(out: Path) -> None:
    """Branches are a new run of their own: ``out`` must be absent or an empty directory (there is nothing to resume)."""
    from rollcap.rollout.errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    from rollcap.kernels.files import cannot_create_dir

    if why := cannot_create_dir(out):
        raise ConfigError("out", why)
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(
            "out",
            f"{out}: directory is not empty; branches are recorded as a new run, which cannot resume another: choose another `out` or remove it",
        )


def _check_address(address: str | None, actors: int) -> None:
    if (
        address is not None and not actors
    ):  # flag words in the Python API too: tests/rollout/ray/test_ray_cluster.py pins this message
        raise ValueError("--address: needs --actors N (the branches run in this process otherwise)")


class _Built:
    """The recording's env, the runners, a host with the recording's config and (with actors) a pool; closed on exit."""

    def __init__(self, parts, rec, file, actors: int, address: str | None = None, env: str | None = None):
        self.parts, self.rec, self.file, self.actors, self.address, self.env = (
            parts,
            rec,
            str(file),
            actors,
            address,
            env,
        )
        self.parts_list = []

    def __enter__(self):
        import dataclasses

        from rollcap.rollout.build import make_env, named_env

        if isinstance(
            self.parts, dict
        ):  # fields given (None: not given): the rest as the recording (offline/deployment.py)
            from rollcap.rollout.build import Parts
            from rollcap.rollout.offline.deployment import recorded_parts

            given, said = recorded_parts(
                {k: v for k, v in self.parts.items() if k not in ("env_id", "env_kwargs")}, self.rec, self.file
            )
            for line in said:
                print(f"rollcap: branch: {line}", file=sys.stderr)
            self.parts = Parts(**given)
        self.parts = dataclasses.replace(self.parts, env_id=self.rec.env_id, env_kwargs=self.rec.env_kwargs or None)
        try:
            named = named_env(self.rec.env_id, self.env, self.file)
            env = make_env(self.rec.env_id, self.rec.env_kwargs, source=None if named else self.file)
            self.parts_list.append(env)
            policy, critic = self._runners(env)
            self.host = _host(self.rec, env, policy, critic)
            pool = None
            if self.actors:
                from rollcap.rollout.ray.branch import BranchActor
                from rollcap.rollout.ray.actors import ActorPool, check_actor_run, identity

                check_actor_run("env", self.parts.policy, self.parts.critic)
                pool = ActorPool(
                    self.parts,
                    self.host.config,
                    self.actors,
                    self.address,
                    expect=identity(self.host),
                    actor_cls=BranchActor,
                )
                self.parts_list.insert(0, pool)
        except BaseException:
            self.__exit__()
            raise
        return self.host, pool

    def _runners(self, env):
        """The recording's runners: for an episode of a batched run, one row of runners captured at its batch (so the
        control can be byte-exact, as replay does), else batch-1 runners."""
        from rollcap.rollout.batch import make_batched_runners, recorded_batch, row_views
        from rollcap.rollout.build import make_runners

        batch = recorded_batch(self.rec.fingerprints)
        if batch == 1 or self.actors:  # branch actors build batch-1 runners: the control then says "not comparable"
            policy, critic = make_runners(self.parts, env, source=self.file)
            self.parts_list += [policy, critic]
            return policy, critic
        policy, critic = make_batched_runners(self.parts, batch, env, source=self.file)
        self.parts_list += [policy, critic]
        return row_views(policy, critic)

    def __exit__(self, *exc):
        for part in self.parts_list:
            if part is not None:
                part.close()
        self.parts_list = []


def cmd_branch(args) -> int:
    from rollcap.rollout.build import Parts
    from rollcap.rollout.errors import ConfigError

    if args.every < 1:
        raise ConfigError("every", f"expected an integer >= 1, got {args.every}")
    formats = tuple(f for f in args.formats.split(",") if f)
    parts = args.options.values(args, Parts)  # None: as the recording (offline/deployment.py), resolved when it is read
    if args.calibrate:
        return _calibrate(args, parts)
    result, summary = branch_episode(args.file, args.episode, args.chunk, args.n, seed=args.seed, control=not args.no_control,
                             out=args.out, formats=formats, actors=args.actors, parts=parts, address=args.address, env=args.env)  # fmt: skip
    for row in summary["branches"]:
        print(
            f"branch {row['branch']:>3} {'(' + row['noise'] + ')':<8} seed {row['seed']:>20}  {row['steps']:>4} steps  {row['stop_reason']:<15} {'success' if row['success'] else 'failure'}  return {row['return']:+.2f}"
        )
    print(result.mc.line())
    print(f"control: {summary['control']}")
    print(
        f"wrote {len(result.records)} branch episode(s) to {summary['out']} (replay: rollcap replay {summary['out']})"
    )
    return 1 if result.control is not None and result.control_diff is not None and not result.fingerprint_diff else 0


def _host(rec, env, policy, critic):
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    critic = critic if "critic" in rec.fingerprints else None
    return RolloutHost(env, policy, critic, HostConfig.from_json(rec.config))


def _calibrate(args, parts) -> int:
    from rollcap.rollout.errors import ConfigError
    from rollcap.rollout.offline.calibrate import calibrate, check_calibration, load_for_calibration

    if args.actors < 0:
        raise ConfigError("actors", f"expected an integer >= 0, got {args.actors}")
    _check_address(args.address, args.actors)
    parents = load_for_calibration(args.file, args.episode)
    out = args.out or Path("runs") / "calibration"
    try:
        check_calibration(
            parents, None, args.n, out
        )  # before building anything; calibrate() checks the parents against the env too
    except ImportError as err:  # matplotlib, for the plot: --calibrate cannot work here
        raise ConfigError("calibrate", str(err)) from None
    with _Built(parts, parents[0][1], args.file, args.actors, args.address, args.env) as (host, pool):
        env, policy, critic = host.env, host.policy, host.critic
        report = calibrate(
            parents,
            lambda rec: _host(rec, env, policy, critic),
            args.n,
            args.every,
            out,
            pool=pool,
            seed=args.seed,
            log=print,
        )
    print(json.dumps(report["stats"], indent=2))
    print(f"wrote {out / 'calibration.json'} and {out / 'calibration.png'}")
    return 0
