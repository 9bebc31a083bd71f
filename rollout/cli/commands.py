"""The ``rollcap`` command line: run, replay, inspect, export, branch, recap, bench, capsule inspect."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rollcap.rollout.cli.signals import SIGNALS as _SIGNALS
from rollcap.rollout.cli.signals import Terminated as _Terminated

EXAMPLES = """examples:
  rollcap run                                   10 episodes of the built-in task, shipped policy + critic
  rollcap run --episodes 50 --critic-threshold -0.8 --out runs/eval
  rollcap replay runs/latest/episodes.hdf5      prove every episode reproduces byte-for-byte
  rollcap inspect runs/latest --plot plots/     episode table, PNG per episode
  rollcap export runs/latest --to lerobot --root datasets/latest   a LeRobotDataset v3 (--to minari: a Minari dataset)
  rollcap branch runs/latest --episode 0 --chunk 5 --n 16    16 continuations + the control; Monte-Carlo value
  rollcap bench --json bench.json               latency, overlap, capsule, env, host, recording figures
  rollcap capsule inspect path/to/capsule       a disk capsule's manifest and digest check
  rollcap recap runs/collect --out runs/recap1  refit the critic, fine-tune the policy on the run, evaluate (RECAP)
"""


class UserError(Exception):
    """A mistake in arguments or input files: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``rollcap run: error: --episodes: invalid int value: 'x'`` and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message.replace('argument ', '', 1)} (see --help)\n")


# --------------------------------------------------------------------- run
def _parts_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = (), as_recorded: bool = False):
    """The Parts flags; ``as_recorded`` (replay, branch): device, backend, precision, sampler, policy and critic default to the recording's."""
    from rollcap.rollout.build import Parts
    from rollcap.rollout.cli.options import Options
    from rollcap.rollout.offline.deployment import AS_RECORDED

    opts = Options(p)
    said = " Default: the recording's, where this machine has it."
    docs = {} if not as_recorded else {f: _first_sentence(Parts, f) + said for f in AS_RECORDED}
    opts.add(Parts, flags={"env_id": "--env"}, skip=skip, help=docs, unset=AS_RECORDED if as_recorded else ())
    return opts


def _first_sentence(cls, field: str) -> str:
    from rollcap.rollout.cli.options import field_docs

    doc = field_docs(cls).get(field, "")
    head = doc.split(" (default")[0].split("; default")[0].rstrip(".")
    return head + ")" * (head.count("(") - head.count(")")) + "."  # a parenthesis the cut left open is closed


def _run_options(p: argparse.ArgumentParser):
    from rollcap.rollout.api import RunConfig
    from rollcap.rollout.config import HostConfig

    opts = _parts_options(p)
    opts.add(RunConfig, flags={"formats": "--format"})
    opts.add(HostConfig)
    return opts


def cmd_run(args) -> int:
    from rollcap.kernels.files import cannot_create_dir
    from rollcap.rollout.api import Interrupted, RunConfig, run
    from rollcap.rollout.errors import ConfigError
    from rollcap.rollout.build import Parts, make_env, make_runners
    from rollcap.rollout.config import HostConfig

    _SIGNALS.poll()  # the heavy imports are done: a Ctrl-C held during them stops here, not after the build and capture
    opts = args.options
    parts = Parts(**opts.values(args, Parts))
    host_cfg, run_cfg = HostConfig(**opts.values(args, HostConfig)), RunConfig(**opts.values(args, RunConfig))
    if run_cfg.out is not None and (why := cannot_create_dir(run_cfg.out)):
        raise ConfigError("out", why)  # before the env and the runners are built: a bad --out costs nothing
    built = []
    opts = {
        **dataclasses.asdict(host_cfg),
        **{k: v for k, v in dataclasses.asdict(run_cfg).items() if k not in ("episodes", "out")},
    }
    try:
        if (
            run_cfg.actors or run_cfg.envs > 1
        ):  # actors (or a batched run: N envs, runners at batch N) build from names and paths; run() checks them here first and releases Ctrl-C once the actors are up
            names = {k: v for k, v in dataclasses.asdict(parts).items() if k not in ("env_id", "policy", "critic")}
            result = run(
                run_cfg.episodes,
                out=run_cfg.out,
                env=parts.env_id,
                policy=parts.policy,
                critic=parts.critic or "none",
                on_started=_SIGNALS.release,
                on_finished=_SIGNALS.finish,
                poll_stop=_SIGNALS.poll,
                **opts,
                **names,
            )
        else:
            env = make_env(parts.env_id, parts.env_kwargs)
            built.append(env)
            _SIGNALS.poll()
            policy, critic = make_runners(parts, env, rtc=host_cfg.chunking != "sync")
            built += [policy, critic]
            _SIGNALS.release()  # start-up is over: a Ctrl-C held during it stops here
            result = run(
                run_cfg.episodes,
                out=run_cfg.out,
                env=env,
                policy=policy,
                critic=critic or "none",
                on_finished=_SIGNALS.finish,
                **opts,
            )
    except Interrupted as stop:
        print(_summary_table(stop.result.summary))
        dropped = stop.result.summary["unwritten_at_interrupt"]
        note = (
            f"; {len(dropped)} finished but unwritten episode(s) dropped ({dropped[0]}..{dropped[-1]})"
            if dropped
            else ""
        )
        print(
            f"interrupted: {stop.result.summary['episodes']} whole episode(s) of this session kept in {stop.result.run_dir}{note}",
            file=sys.stderr,
        )
        return 143 if isinstance(stop.cause, _Terminated) else 130
    finally:
        for part in built:
            if part is not None:
                part.close()
    print(_summary_table(result.summary))
    failed = result.summary.get("failed")
    if failed:  # episodes whose every try killed its actor (or raised there): not recorded
        print(
            f"rollcap run: error: {len(failed)} episode(s) failed on the actors ({', '.join(failed)}): {next(iter(failed.values()))}; --resume runs them again",
            file=sys.stderr,
        )
        return 1
    return 0


def _summary_table(s: dict) -> str:
    from rollcap.rollout.stats import rate_line

    rows = [
        ("run directory", s["run_dir"]),
        ("episodes", str(s["episodes"])),
        ("success rate", rate_line(s["successes"], s["episodes"]) + " (Wilson 95%)" if s["episodes"] else "-"),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in s["stop_reasons"].items()) or "-"),
        ("chunks", str(s["chunks"])),
        ("chunk boundary", f"median {s['boundary_ms_median']:.2f} ms, p99 {s['boundary_ms_p99']:.2f} ms"),
        ("policy | critic", f"median {s['policy_ms_median']:.2f} ms | {s['critic_ms_median']:.2f} ms"),
        ("wall", f"{s['wall_s']:.1f} s"),
    ]
    if s.get("discarded_by_key"):
        n, which = len(s["discarded_by_key"]), ", ".join(map(str, s["discarded_by_key"]))
        rows.append(("discarded by key", f"{n} (episode{'s' if n > 1 else ''} {which}; not recorded)"))
    if "actors" in s:
        rows.append(
            (
                "ray actors",
                f"{s['actors']} on {s['nodes']} node(s) ({s['address']}), {s['retries']} retried, {len(s['failed'])} failed; start-up {s['actors_start_s']:.1f} s",
            )
        )
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


# ------------------------------------------------------------------ replay
def cmd_replay(args) -> int:
    from rollcap.rollout.build import Parts
    from rollcap.rollout.offline.deployment import recorded_parts
    from rollcap.rollout.offline.replay import MODES, Replayer, summary_line
    from rollcap.rollout.recording import iter_episodes

    modes = [m for m in args.mode.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise UserError(f"--mode: expected a comma list of {','.join(MODES)}, got {args.mode!r}")
    if args.actors < 0:
        raise UserError(f"--actors: expected an integer >= 0, got {args.actors}")
    if args.address is not None and not args.actors:
        raise UserError(f"--address {args.address}: joining a Ray cluster needs --actors >= 1")

    def episodes():  # streamed: one episode in memory at a time, however large the run
        return (item for f in args.files for item in iter_episodes(f))

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
        from rollcap.rollout.ray.actors import check_actor_run
        from rollcap.rollout.ray.replay import replay_on_actors

        check_actor_run("env", parts.policy, parts.critic)
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
    from rollcap.rollout.offline.inspect import (
        check_plot_dir,
        episode_table,
        plot_episodes,
        readable_episodes,
    )
    from rollcap.rollout.recording import iter_episodes

    if args.plot is not None:
        check_plot_dir(args.plot)  # a bad --plot costs nothing
    thresholds = _thresholds(args.early_stop) if args.early_stop is not None else None
    if args.patience < 1:
        raise UserError(f"--patience: expected an integer >= 1, got {args.patience}")
    bad: list = []
    for path in args.file:  # streamed: memory is one episode's, whatever the run's size; a bad episode is a row
        print(episode_table(iter_episodes(path), unreadable=bad))
    if thresholds is not None:
        from rollcap.rollout.offline.early_stop import boundaries_of, early_stop_rows, table

        try:
            eps = [boundaries_of(rec, str(path)) for path in args.file for rec in readable_episodes(path)]
        except ValueError as err:
            raise UserError(f"--early-stop: {err}") from err
        print(table(early_stop_rows(eps, thresholds, args.patience)))
    if args.plot is not None:
        for path in args.file:
            for png in plot_episodes(
                list(readable_episodes(path)), args.plot
            ):  # branch fans need the episodes together
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
    import importlib.util

    from rollcap.rollout.recording.exporters import export

    if importlib.util.find_spec(args.to) is None:  # the wrong venv is the likeliest mistake: say so first
        raise UserError(
            f"--to {args.to}: {args.to} is not importable in this Python ({sys.version.split()[0]}); it lives in LeRobot's venv: bash scripts/lerobot_env.sh, then run .venv-lerobot/bin/rollcap"
        )

    options = {"extras": tuple(x for x in args.extras.split(",") if x)} if args.extras is not None else {}
    options["labels"] = args.labels
    if args.to == "lerobot":
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
        options["dataset_id"] = args.dataset_id
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


# ------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    from rollcap.rollout.bench.batch_options import batch_options
    from rollcap.rollout.bench.report import format_report, run_bench
    from rollcap.rollout.build import Parts

    parts = Parts(**args.options.values(args, Parts))
    only = [s for s in args.only.split(",") if s] if args.only else None
    actors = args.actors or (2 if only and "ray" in only else 0)
    if args.actors < 0 or args.actors == 1:
        raise UserError(f"--actors: the Ray section compares 1 actor with N >= 2, got {args.actors}")
    sizes = tuple(s for s in (args.policy_size or "").split(",") if s)
    try:
        report = (
            run_bench(
                parts,
                quick=args.quick,
                only=tuple(s for s in only or () if s != "ray") or None,
                sizes=sizes,
                batch=batch_options(args.batch_envs, args.batch_workers, args.batch_standin),
            )
            if only != ["ray"]
            else {}
        )
    except ValueError as err:
        if not str(err).startswith("--policy-size"):
            raise
        raise UserError(str(err)) from None
    if report:
        print(format_report(report))
    if actors:  # Ray batch rollouts: 1 vs N actors vs AsyncVectorEnv(N), the shipped policy and critic
        from rollcap.rollout.bench.ray import format_report as format_ray
        from rollcap.rollout.bench.ray import run_bench as run_ray

        report["ray"] = run_ray(
            episodes=8 if args.quick else 40,
            steps=40 if args.quick else 300,
            rounds=1 if args.quick else 2,
            actors=actors,
        )
        print("ray (Ray batch rollouts, shipped policy and critic):\n" + format_ray(report["ray"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


# -------------------------------------------------------------------- main
def _json_object(text: str) -> dict:
    from rollcap.rollout.cli.options import json_object

    return json_object(text)


_json_object.__name__ = "JSON"


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="rollcap",
        description="Rollouts for robot policies: captured-graph VLA inference, a concurrent critic, capsule reset, bit-exact recordings.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, func, help: str, description: str, example: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=description,
            epilog=f"example: {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    p = command(
        "run",
        cmd_run,
        "run episodes and record them (the main job)",
        "Run N episodes of a task with a policy and a critic; record npz + robomimic HDF5; print a summary.",
        "rollcap run --episodes 20 --critic-threshold -0.8 --out runs/eval",
    )
    p.set_defaults(options=_run_options(p))

    p = command(
        "replay",
        cmd_replay,
        "replay recordings and check they are byte-identical",
        "Replay recorded episodes in three modes: policy (recorded obs + noise through the policy and critic), env (recorded actions from the initial sim state), closed (re-run from the seed). Each episode is checked separately; the summary counts exact, diverged, not comparable and failed. Exit 0 only when every episode was checked and exact.",
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
        help="allow the recording's env id (it must be the same); needed for a 'module:Env' id, which is never imported from a file otherwise; 'module:Env' also names a recording of Env",
    )
    p.add_argument(
        "--env-kwargs",
        default=None,
        type=_json_object,
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
        help="with --actors: the Ray cluster to join (auto, host:port or ray://host:port; default: a new local Ray on 127.0.0.1 only)",
    )
    p.set_defaults(options=_parts_options(p, skip=("env_id", "env_kwargs"), as_recorded=True))

    p = command("inspect", cmd_inspect, "print an episode table; plot critic value and actions; what a critic threshold would do",
                "Print a table of the episodes in an npz file, an HDF5 file or a run directory; --early-stop replays the critic's stop "
                "predicate on their recorded values for each threshold.", "rollcap inspect runs/eval --plot runs/eval/plots --early-stop -0.9 -0.8")  # fmt: skip
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
        "export a recording as a LeRobotDataset v3 or a Minari dataset",
        "Export the episodes of a run directory (or one npz / HDF5 file) as a LeRobotDataset v3 (--to lerobot: images lossless as PNG frames, the instruction as task, reward/done/success/intervention/critic value per frame) or a Minari dataset (--to minari: HDF5, observations with the final one). The dataset is written beside its target and renamed into place when whole: a failure leaves nothing. Needs lerobot / minari: run it with LeRobot's venv (bash scripts/lerobot_env.sh).",
        "rollcap export runs/demos --to lerobot --root datasets/demos --obs-keys state --instruction-dims 32",
    )
    p.add_argument("run", type=Path, help="run directory, npz file or HDF5 file")
    p.add_argument("--to", required=True, choices=("lerobot", "minari"), help="the dataset format")
    p.add_argument(
        "--root",
        required=True,
        type=Path,
        help="lerobot: the dataset directory to create (absent or empty); minari: the datasets root (the dataset goes to ROOT/DATASET_ID)",
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
        help="lerobot: comma list of observation keys to export (default all), e.g. state for a policy without images",
    )
    p.add_argument(
        "--instruction-dims",
        type=int,
        default=0,
        metavar="N",
        help="lerobot: also write the instruction as observation.environment_state, an N-dim hashed bag of words, for policies with no language input (ACT, Diffusion Policy); --policy lerobot:DIR computes the same at run time",
    )
    p.add_argument("--dataset-id", default=None, help="minari: the dataset id (default rollcap/<run name>-v0)")
    p.add_argument(
        "--labels",
        choices=("recorded", "expert"),
        default="recorded",
        help="the actions written: recorded (what the env received, default) or expert: the clean scripted expert's action on each recorded observation (DART: record with --policy expert:STD, label clean; built-in task only; the dataset says so)",
    )

    p = command(
        "bench",
        cmd_bench,
        "measure latency, overlap, capsules, env and host overhead",
        "Measure, in one run: policy chunk latency eager vs captured, critic latency, policy||critic vs serial, capture time, exactness, capsule snapshot/restore, env steps/s, host and recording overhead.",
        "rollcap bench --quick --json bench.json",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("--quick", action="store_true", help="fewer repeats (for smoke tests)")
    p.add_argument(
        "--actors",
        type=int,
        default=0,
        metavar="N",
        help="also measure Ray batch rollouts (section ray): 1 vs N actors vs AsyncVectorEnv(N), 2-5 min; --only ray runs just that (N default 2)",
    )
    p.add_argument(
        "--only",
        default=None,
        help="comma list of sections: models,capsule,env,host,gym,branch,scaling,peer,recording; opt-in: backends (the CPU plans jit/aoti/compile side by side; minutes on a cold compile cache), batch (envs 1 and 8, in this process and in env workers, the shipped policy and a 4 ms stand-in, recorded; --batch-*; ~4 min)",
    )
    from rollcap.rollout.bench.batch_options import add_batch_arguments

    add_batch_arguments(p)
    p.add_argument(
        "--policy-size",
        default=None,
        metavar="LIST",
        help="section models: comma list of FlowVLA sizes (shipped,26m,205m,300m,3b, or a config .json) swept with random weights, plain and fused, eager vs the --backend's graph at --precision (default: shipped,26m on CPU, all on a GPU; --quick on CPU: shipped)",
    )
    p.set_defaults(options=_parts_options(p))

    from rollcap.rollout.cli.branch import add_parser as add_branch_parser

    add_branch_parser(command, _parts_options)
    from rollcap.rollout.cli.recap import add_parser as add_recap_parser

    add_recap_parser(command)
    from rollcap.rollout.cli.merge import add_parser as add_merge_parser

    add_merge_parser(command)

    p = sub.add_parser("capsule", help="capsule tools", description="Tools for disk capsules.")
    csub = p.add_subparsers(dest="capsule_command", metavar="COMMAND", parser_class=_Parser)
    csub.required = True
    from rollcap.capsule.cli import add_subparser

    add_subparser(csub)
    return ap
