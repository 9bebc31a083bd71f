"""``rollcap branch``: branch a recorded episode at a chunk boundary (or calibrate the critic over many).

Flags only: ``rollcap.branch`` (:func:`rollcap.rollout.api.branch_episode`,
whose work is :mod:`rollcap.rollout.offline.branching`) or, with ``--calibrate``,
:func:`rollcap.rollout.offline.calibrate.calibrate` on the recording's rebuilt
deployment. The main CLI registers the subcommand through :func:`add_parser`.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollcap.rollout.errors import ConfigError
from rollcap.rollout.cli.recordings import ADDRESS_HELP, ENV_HELP
from rollcap.rollout.spec import Parts

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
        help=ADDRESS_HELP,
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
        help=ENV_HELP,
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="Monte-Carlo values at many boundaries: every --every-th chunk of every episode (or --episode); branches not recorded",
    )
    p.add_argument("--every", type=int, default=1, help="with --calibrate: every this many chunks (default 1)")
    p.set_defaults(options=parts_options(p, skip=("env_id", "env_kwargs"), as_recorded=True))


def cmd_branch(args) -> int:
    if args.every < 1:
        raise ConfigError("every", f"expected an integer >= 1, got {args.every}")
    formats = tuple(f for f in args.formats.split(",") if f)
    from rollcap.rollout.api import (
        branch_episode,
    )  # the command's modules (torch): imported when it runs, not for --help

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


def _calibrate(args, parts) -> int:
    from rollcap.rollout.api import branch_pool
    from rollcap.rollout.offline.branching import RecordedDeployment, check_address, recorded_host
    from rollcap.rollout.offline.calibrate import calibrate, check_calibration, load_for_calibration

    if args.actors < 0:
        raise ConfigError("actors", f"expected an integer >= 0, got {args.actors}")
    check_address(args.address, args.actors)
    parents = load_for_calibration(args.file, args.episode)
    out = args.out or Path("runs") / "calibration"
    try:
        check_calibration(
            parents, None, args.n, out
        )  # before building anything; calibrate() checks the parents against the env too
    except ImportError as err:  # matplotlib, for the plot: --calibrate cannot work here
        raise ConfigError("calibrate", str(err)) from None
    pool_for = branch_pool(args.actors, args.address)
    with RecordedDeployment(parts, parents[0][1], args.file, args.actors, args.env, pool_for) as (host, pool):
        env, policy, critic = host.env, host.policy, host.critic
        report = calibrate(
            parents,
            lambda rec: recorded_host(rec, env, policy, critic),
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
