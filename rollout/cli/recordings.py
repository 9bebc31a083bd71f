"""The commands over recordings: ``replay``, ``inspect``, ``export`` (their parsers and what they do)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from rollcap.rollout.options import UserError, json_object
from rollcap.rollout.spec import Parts

ENV_HELP = (
    "allow the recording's env id (it must be the same); needed for a 'module:Env' id, which is never imported "
    "from a file otherwise; 'module:Env' also names a recording of Env"
)
"""``--env``'s help wherever a recording's env is rebuilt (replay, branch)."""
ADDRESS_HELP = "with --actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only)"


def add_parsers(command, parts_options) -> None:
    """Register ``replay``, ``inspect`` and ``export`` through the main CLI's ``command(name, func, help, description, example)``."""
    p = command(
        "replay",
        cmd_replay,
        "replay recordings and check they are byte-identical",
        "Replay recorded episodes in three modes: policy (recorded obs + noise through the policy and critic), env (recorded actions from the initial sim state), closed (re-run from the seed). Each episode is checked separately; a run directory that recorded both formats is read from its npz files and each episode checked against its copy in episodes.hdf5 (a damaged, short or different HDF5 file fails, named). The summary counts exact, diverged, not comparable and failed. Exit 0 only when every episode was checked and exact.",
        "rollcap replay runs/eval/episodes.hdf5 --mode policy,env",
    )
    p.add_argument("files", nargs="+", type=Path, help="npz files, HDF5 files or run directories")
    p.add_argument("--mode", default="policy,env,closed", help="comma list of policy,env,closed (default: all)")
    p.add_argument(
        "--accept-not-comparable",
        action="store_true",
        help="exit 0 when episodes recorded on another deployment fingerprint could only be compared, not proven exact",
    )
    p.add_argument(
        "--env",
        default=None,
        help=ENV_HELP,
    )
    p.add_argument(
        "--env-kwargs",
        default=None,
        type=json_object,
        metavar="JSON",
        help="must equal the recording's (replay always uses the recording's env kwargs)",
    )
    p.add_argument(
        "--actors",
        type=int,
        default=0,
        metavar="N",
        help="replay on N Ray actors (0: in this process); output and verdicts are the same; needs pip install 'rollcap[ray]'",
    )
    p.add_argument(
        "--address",
        default=None,
        help=ADDRESS_HELP,
    )
    p.set_defaults(options=parts_options(p, skip=("env_id", "env_kwargs"), as_recorded=True))

    p = command("inspect", cmd_inspect, "print an episode table; plot critic value and actions; what a critic threshold would do",
                "Print a table of the episodes in an npz file, an HDF5 file or a run directory (both formats of a run directory: an "
                "unreadable file or episode is a BAD row and exit 1); --early-stop replays the critic's stop predicate on their recorded "
                "values for each threshold.", "rollcap inspect runs/eval --plot runs/eval/plots --early-stop -0.9 -0.8")  # fmt: skip
    p.add_argument("file", type=Path, nargs="+", help="npz file, HDF5 file or run directory (several: one table each)")
    p.add_argument(
        "--plot", type=Path, default=None, metavar="DIR", help="write one PNG per episode into DIR (needs matplotlib)"
    )
    p.add_argument(
        "--early-stop",
        default=None,
        nargs="+",
        type=float,
        metavar="THRESHOLD",
        help="critic thresholds, e.g. -0.9 -0.8: what each would do to these episodes "
        "(stopped, of them would have succeeded, success with the stops, steps saved), from episodes recorded with a critic and no threshold, all runs together",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=2,
        help="with --early-stop: consecutive boundaries below the threshold before a stop (as --critic-patience; default 2)",
    )

    p = command(
        "export",
        cmd_export,
        "export a recording as a LeRobotDataset v3, a Minari dataset or chunk transitions (npz)",
        "Export the episodes of a run directory (or one npz / HDF5 file) as a LeRobotDataset v3 (--to lerobot: images lossless as PNG frames, the instruction as task, reward/done/success/intervention/critic value per frame) or a Minari dataset (--to minari: HDF5, observations with the final one). The dataset is written beside its target and renamed into place when whole: a failure leaves nothing. Needs lerobot / minari: run it with LeRobot's venv (bash scripts/lerobot_env.sh). --to chunks writes the chunk-level transitions for offline RL as one npz (numpy only): per executed chunk its boundary's observation, noise, policy chunk, executed actions, return, next observation and done flags.",
        "rollcap export runs/demos --to lerobot --root datasets/demos --obs-keys state --instruction-dims 32",
    )
    p.add_argument("run", type=Path, help="run directory, npz file or HDF5 file")
    p.add_argument("--to", required=True, choices=("lerobot", "minari", "chunks"), help="the dataset format")
    p.add_argument(
        "--root",
        required=True,
        type=Path,
        help="lerobot: the dataset directory to create (absent or empty); minari: the datasets root (the dataset goes to ROOT/DATASET_ID); chunks: the .npz file to create",
    )
    p.add_argument(
        "--extras",
        default=None,
        metavar="LIST",
        help="comma list of per-step extras: reward,done,success,intervention,critic_value (default: all; '' for none)",
    )
    p.add_argument("--repo-id", default=None, help="lerobot: the dataset's repo id (default rollcap/<root's name>)")
    p.add_argument(
        "--fps",
        type=int,
        default=None,
        help="lerobot: frames per second (default: the recording's control rate, 1 / the env's dt: the built-in task's 10, MetaWorld's 80; refused when the recording cannot tell it)",
    )
    p.add_argument(
        "--videos", action="store_true", help="lerobot: store images as videos (lossy, smaller) instead of PNG frames"
    )
    p.add_argument(
        "--obs-keys",
        default=None,
        metavar="LIST",
        help="lerobot, chunks: comma list of observation keys to export (default all), e.g. state for a policy without images",
    )
    p.add_argument(
        "--instruction-dims",
        type=int,
        default=0,
        metavar="N",
        help="lerobot: also write the instruction as observation.environment_state, an N-dim hashed bag of words, for policies with no language input (ACT, Diffusion Policy); --policy lerobot:DIR computes the same at run time",
    )
    p.add_argument("--dataset-id", default=None, help="minari: the dataset id (default rollcap/<run name>-v0)")
    p.add_argument("--author", default=None, help="minari: who made the dataset (Minari recommends it)")
    p.add_argument("--author-email", default=None, help="minari: how to reach them (Minari recommends it)")
    p.add_argument(
        "--code-permalink",
        default=None,
        help="minari: a link to the versioned code that made it (Minari recommends it)",
    )
    p.add_argument(
        "--gamma",
        type=float,
        default=None,
        help="chunks: the per-step discount inside a chunk's return, 0 < gamma <= 1 (default 1: the plain sum of its rewards)",
    )
    p.add_argument(
        "--labels",
        choices=("recorded", "expert"),
        default="recorded",
        help="the actions written: recorded (what the env received, default) or expert: the clean scripted expert's action on each recorded observation (DART: record with --policy expert:STD, label clean; built-in task only; the dataset says so)",
    )


# ------------------------------------------------------------------ replay
def cmd_replay(args) -> int:
    # the command's modules (torch, the runners): imported when it runs, not for --help
    from rollcap.rollout.offline.deployment import recorded_parts
    from rollcap.rollout.offline.replay import MODES, Replayer, summary_line
    from rollcap.rollout.ray.episodes import check_actor_run
    from rollcap.rollout.recording import iter_episodes

    modes = [m for m in args.mode.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise UserError(f"--mode: expected a comma list of {','.join(MODES)}, got {args.mode!r}")
    if args.actors < 0:
        raise UserError(f"--actors: expected an integer >= 0, got {args.actors}")
    if args.address is not None and not args.actors:
        raise UserError(f"--address {args.address}: joining a Ray cluster needs --actors >= 1")

    def episodes():  # streamed: one episode in memory at a time, however large the run; every format a run wrote
        return (item for f in args.files for item in iter_episodes(f, every_format=True))

    firsts = [
        next(iter_episodes(f), None) for f in args.files
    ]  # an unreadable path stops the replay before anything runs (reads one episode)
    recorded_env = next((rec.env_id for _, rec in filter(None, firsts) if not isinstance(rec, Exception)), None)
    if args.env is not None or args.env_kwargs is not None:
        for source, rec in episodes():  # a mismatched --env / --env-kwargs stops the replay before anything runs
            if not isinstance(rec, Exception):
                _check_replay_env(args, rec, source)
    items = list(episodes()) if args.actors else episodes()  # the Ray path keeps them for its retries
    given = {k: v for k, v in args.options.values(args, Parts).items() if k not in ("env_id", "env_kwargs")}
    source, first = next((item for item in filter(None, firsts) if not isinstance(item[1], Exception)), (None, None))
    # device, backend, precision and models not given: the recording's (offline/deployment.py)
    given, said = recorded_parts(given, first, source, needs_models=bool(set(modes) & {"policy", "closed"}))
    for line in said:
        print(f"rollcap: replay: {line}", file=sys.stderr)
    parts = Parts(
        **given, **({"env_id": recorded_env} if recorded_env else {})
    )  # the defaults: the shipped models of the recording's env
    import_env = args.env is not None
    results, pool = [], {}
    if args.actors:
        from rollcap.rollout.ray.replay import replay_on_actors  # Ray's modules: only for --actors

        check_actor_run(parts)
        per_episode = replay_on_actors(
            items, modes, parts, args.actors, args.address, import_env=import_env, summary=pool
        )
    else:
        replayer = Replayer(parts)
        per_episode = (replayer.check(source, rec, modes, import_env) for source, rec in items)
    try:
        for batch in per_episode:  # one episode's results, in the order of the files
            for res in batch:
                results.append(res)
                print(res.line())
    finally:
        if args.actors:
            per_episode.close()
        else:
            replayer.close()
    line, ok = summary_line(results, accept_not_comparable=args.accept_not_comparable)
    if pool:
        line += f" (on {pool['actors']} Ray actor(s), {pool['nodes']} node(s); {pool['retries']} retried)"
    print(line)
    return 0 if ok else 1


def _check_replay_env(args, rec, source: str) -> None:
    """An explicit --env / --env-kwargs must name the recording's env (--env module:id may name a recording of id)."""
    from rollcap.rollout.build import named_env

    named_env(rec.env_id, args.env, source)
    if args.env_kwargs is not None and args.env_kwargs != rec.env_kwargs:
        raise UserError(
            f"--env-kwargs {json.dumps(args.env_kwargs)}: {source} was recorded with {json.dumps(rec.env_kwargs)}; replay uses the recording's"
        )


# ----------------------------------------------------------------- inspect
def cmd_inspect(args) -> int:
    from rollcap.rollout.offline.early_stop import boundaries_of, early_stop_rows, table
    from rollcap.rollout.offline.inspect import check_plot_dir, episode_table, plot_episodes, readable_episodes
    from rollcap.rollout.recording import iter_episodes

    if args.plot is not None:
        check_plot_dir(args.plot)  # a bad --plot costs nothing
    thresholds = _thresholds(args.early_stop) if args.early_stop is not None else None
    if args.patience < 1:
        raise UserError(f"--patience: expected an integer >= 1, got {args.patience}")
    bad: list = []
    for path in args.file:  # streamed: memory is one episode's, whatever the run's size; a bad episode is a row
        print(episode_table(iter_episodes(path, every_format=True), unreadable=bad))
    if thresholds is not None:
        try:
            eps = [boundaries_of(rec, str(path)) for path in args.file for rec in readable_episodes(path)]
        except ValueError as err:
            raise UserError(f"--early-stop: {err}") from err
        print(table(early_stop_rows(eps, thresholds, args.patience)))
    if args.plot is not None:
        for path in args.file:
            for png in plot_episodes(list(readable_episodes(path)), args.plot):  # branch fans: the episodes together
                print(f"wrote {png}")
    return 1 if bad else 0  # an unreadable episode is a failed check, as in replay


def _thresholds(values: list[float]) -> list[float]:
    """``--early-stop``'s critic thresholds, each in [-1, 0]."""
    if any(not -1.0 <= t <= 0.0 for t in values):
        raise UserError(
            f"--early-stop: expected critic thresholds in [-1, 0], got {' '.join(f'{t:g}' for t in values)}"
        )
    return list(values)


# ------------------------------------------------------------------ export
def cmd_export(args) -> int:
    from rollcap.rollout.recording.exporters import export  # the exporters' modules: only for export

    if args.to != "chunks" and importlib.util.find_spec(args.to) is None:  # the wrong venv: say so first
        raise UserError(
            f"--to {args.to}: {args.to} is not importable in this Python ({sys.version.split()[0]}); it lives in LeRobot's venv: bash scripts/lerobot_env.sh, then run .venv-lerobot/bin/rollcap"
        )

    if args.to == "chunks":
        return _export_chunks(args)
    if args.gamma is not None:
        raise UserError(f"--gamma: an option of --to chunks, not --to {args.to}")
    options = {"extras": tuple(x for x in args.extras.split(",") if x)} if args.extras is not None else {}
    options["labels"] = args.labels
    if args.to == "lerobot":
        minari_only = [f for f, on in (("--author", args.author), ("--author-email", args.author_email),
                                       ("--code-permalink", args.code_permalink), ("--dataset-id", args.dataset_id)) if on]  # fmt: skip
        if minari_only:
            raise UserError(f"{minari_only[0]}: an option of --to minari, not --to lerobot")
        options.update(fps=args.fps, videos=args.videos, instruction_dims=args.instruction_dims)
        if args.repo_id:
            options["repo_id"] = args.repo_id
        if args.obs_keys is not None:
            options["obs_keys"] = tuple(x for x in args.obs_keys.split(",") if x)
    else:
        lerobot_only = [
            f
            for f, on in (
                ("--repo-id", args.repo_id),
                ("--videos", args.videos),
                ("--obs-keys", args.obs_keys is not None),
                ("--instruction-dims", args.instruction_dims),
            )
            if on
        ]
        if lerobot_only:
            raise UserError(f"{lerobot_only[0]}: an option of --to lerobot, not --to minari")
        options.update(
            dataset_id=args.dataset_id,
            author=args.author,
            author_email=args.author_email,
            code_permalink=args.code_permalink,
        )
    try:
        out = export(args.run, args.to, args.root, **options)
    except ImportError as err:  # the target's library lives in LeRobot's venv
        raise UserError(f"--to {args.to}: {str(err).splitlines()[0]}") from err
    except ValueError as err:  # the exporters name their Python argument: name the flag
        arg, sep, rest = str(err).partition(": ")
        flags = {
            "run_dir": "RUN",
            "root": "--root",
            "obs_keys": "--obs-keys",
            "extras": "--extras",
            "instruction_dims": "--instruction-dims",
            "fps": "--fps",
            "dataset_id": "--dataset-id",
            "repo_id": "--repo-id",
            "labels": "--labels",
        }
        raise UserError(f"{flags[arg]}: {rest}" if sep and arg in flags else str(err)) from err
    skipped = f"; {len(out.skipped)} episode(s) without a step skipped" if out.skipped else ""
    if args.to == "lerobot":
        rate = {"given": "--fps", "recorded": "the recording's control rate", "env": "its env's control rate"}[
            out.fps_source
        ]
        print(
            f"wrote {out.root}: LeRobotDataset v3 {out.repo_id!r}, {out.episodes} episodes, {out.frames} frames at {out.fps} fps ({rate}){skipped}"
        )
        print(
            f"read it with LeRobotDataset({out.repo_id!r}, root={str(out.root)!r}); train: lerobot-train --dataset.repo_id={out.repo_id} --dataset.root={out.root} ..."
        )
    else:
        print(
            f"wrote {out.path}: Minari dataset {out.dataset_id!r}, {out.episodes} episodes, {out.steps} steps{skipped}"
        )
        print(f"read it with MINARI_DATASETS_PATH={out.root} and minari.load_dataset({out.dataset_id!r})")
    return 0


def _export_chunks(args) -> int:
    """``--to chunks``: the chunk-level transitions as one npz (numpy only)."""
    from rollcap.rollout.recording.to_chunks import export_chunks

    others = [f for f, on in (("--extras", args.extras is not None), ("--repo-id", args.repo_id), ("--fps", args.fps),
              ("--videos", args.videos), ("--instruction-dims", args.instruction_dims), ("--dataset-id", args.dataset_id),
              ("--labels", args.labels != "recorded")) if on]  # fmt: skip
    if others:
        raise UserError(f"{others[0]}: not an option of --to chunks")
    keys = None if args.obs_keys is None else tuple(x for x in args.obs_keys.split(",") if x)
    try:
        out = export_chunks(args.run, args.root, 1.0 if args.gamma is None else args.gamma, keys)
    except ValueError as err:
        arg, sep, rest = str(err).partition(": ")
        flags = {"run_dir": "RUN", "root": "--root", "obs_keys": "--obs-keys", "gamma": "--gamma"}
        raise UserError(f"{flags[arg]}: {rest}" if sep and arg in flags else str(err)) from err
    skipped = f"; {len(out.skipped)} episode(s) without an executed chunk skipped" if out.skipped else ""
    print(f"wrote {out.transitions} chunk transition(s) of {out.episodes} episode(s) to {out.path}{skipped}")
    return 0
