"""The ``rollcap`` command line: run, replay, inspect, bench, capsule inspect."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXAMPLES = """examples:
  rollcap run                                   10 episodes of the built-in task, shipped policy + critic
  rollcap run --episodes 50 --critic-threshold -0.8 --out runs/eval
  rollcap replay runs/latest/episodes.hdf5      prove every episode reproduces byte-for-byte
  rollcap inspect runs/latest --plot plots/     episode table, PNG per episode
  rollcap bench --json bench.json               latency, overlap, capsule, env, host, recording figures
  rollcap capsule inspect path/to/capsule       a disk capsule's manifest and digest check
"""


class UserError(Exception):
    """A mistake in arguments or input files: printed as one line, exit code 2."""


# --------------------------------------------------------------------- run
def _add_parts_args(p: argparse.ArgumentParser) -> None:
    from rollcap.rollout.build import DEFAULT_ENV

    p.add_argument("--env", default=DEFAULT_ENV, help="gymnasium env id (default: %(default)s)")
    p.add_argument("--env-kwargs", default="{}", metavar="JSON", help='keyword arguments for gym.make as JSON, e.g. \'{"image_size": 32}\'')
    p.add_argument("--policy", type=Path, default=None, help="policy checkpoint .json (default: the shipped one)")
    p.add_argument("--critic", type=Path, default=None, help="critic checkpoint .json (default: the shipped one)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: %(default)s)")
    p.add_argument("--backend", choices=("eager", "jit", "cuda"), default=None, help="graph backend (default: jit on CPU, cuda on GPU)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per lane (default: %(default)s)")


def _parts(args):
    from rollcap.rollout.build import Parts

    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as err:
        raise UserError(f"--env-kwargs: not valid JSON ({err.msg} at char {err.pos}): {args.env_kwargs!r}") from err
    if not isinstance(env_kwargs, dict):
        raise UserError(f"--env-kwargs: expected a JSON object, got {args.env_kwargs!r}")
    kw = {"env_id": args.env, "env_kwargs": env_kwargs, "device": args.device, "backend": args.backend, "threads": args.threads}
    if args.policy is not None:
        kw["policy"] = args.policy
    if args.critic is not None:
        kw["critic"] = args.critic
    if args.threads < 1:
        raise UserError(f"--threads: expected >= 1, got {args.threads}")
    return Parts(**kw)


def _new_run_dir(root: Path) -> Path:
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


def cmd_run(args) -> int:
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.host import HostConfig, RolloutHost
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.subscribers import InBackground, Metrics, Progress

    if args.episodes < 1:
        raise UserError(f"--episodes: expected >= 1, got {args.episodes}")
    formats = tuple(f for f in args.format.split(",") if f)
    bad = [f for f in formats if f not in ("npz", "h5")]
    if bad or not formats:
        raise UserError(f"--format: expected a comma list of npz,h5, got {args.format!r}")
    out = args.out or _new_run_dir(Path("runs"))
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise UserError(f"--out {out}: directory is not empty (use --resume to continue that run, or another --out)")
    try:
        cfg = HostConfig(seed=args.seed, critic_threshold=args.critic_threshold, critic_patience=args.critic_patience, max_chunks=args.max_chunks, max_seconds=args.max_seconds, execute_steps=args.execute_steps)
    except ValueError as err:
        raise UserError(str(err)) from err
    parts = _parts(args)
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts)
    env_meta = {"env_name": parts.env_id, "type": 2, "env_kwargs": dict(env.spec.kwargs or {}) if env.spec else {}}
    recorder = EpisodeRecorder(out, formats=formats, env_meta=env_meta, resume=args.resume)

    writer = InBackground(recorder)  # episodes are written on a writer thread, off the hot path
    metrics = Metrics()
    subs = [writer, metrics]
    if not args.no_progress:
        subs.append(Progress(args.episodes))
    host = RolloutHost(env, policy, critic, cfg, subs)
    start = recorder.next_index if args.resume else 0
    t0 = time.perf_counter()
    interrupted = False
    try:
        host.run(args.episodes, start=start)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()  # drains: every finished episode is written before we exit
    wall = time.perf_counter() - t0
    summary = metrics.summary()
    summary.update({"wall_s": wall, "run_dir": str(out), "interrupted": interrupted})
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2))
    print(_summary_table(summary))
    if interrupted:
        print(f"interrupted: {summary['episodes']} whole episode(s) kept in {out}", file=sys.stderr)
        return 130
    return 0


def _summary_table(s: dict) -> str:
    rows = [
        ("run directory", s["run_dir"]),
        ("episodes", str(s["episodes"])),
        ("success rate", f"{s['success_rate']:.0%} ({s['successes']}/{s['episodes']})" if s["episodes"] else "-"),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in s["stop_reasons"].items()) or "-"),
        ("chunks", str(s["chunks"])),
        ("chunk boundary", f"median {s['boundary_ms_median']:.2f} ms, p99 {s['boundary_ms_p99']:.2f} ms"),
        ("policy | critic", f"median {s['policy_ms_median']:.2f} ms | {s['critic_ms_median']:.2f} ms"),
        ("wall", f"{s['wall_s']:.1f} s"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


# ------------------------------------------------------------------ replay
def cmd_replay(args) -> int:
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.host import HostConfig, RolloutHost
    from rollcap.rollout.inspect import load_any
    from rollcap.rollout.replay import MODES, replay_closed, replay_env, replay_policy

    modes = [m for m in args.mode.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise UserError(f"--mode: expected a comma list of {','.join(MODES)}, got {args.mode!r}")
    records = [r for f in args.files for r in load_any(f)]
    if not records:
        raise UserError(f"{', '.join(map(str, args.files))}: no episodes found")
    parts = _parts(args)
    policy, critic = make_runners(parts)
    failed = 0
    envs: dict[str, object] = {}
    for rec in records:
        for mode in modes:
            if mode == "policy":
                res = replay_policy(rec, policy, critic)
            else:
                env = envs.get(rec.env_id) or envs.setdefault(rec.env_id, make_env(rec.env_id, rec.env_kwargs))
                if mode == "env":
                    res = replay_env(rec, env)
                else:
                    res = replay_closed(rec, RolloutHost(env, policy, critic, HostConfig.from_json(rec.config)))
            failed += res.failed
            print(res.line())
    print(f"{len(records)} episode(s), {len(modes)} mode(s): {'all exact' if not failed else f'{failed} diverged'}")
    return 1 if failed else 0


# ----------------------------------------------------------------- inspect
def cmd_inspect(args) -> int:
    from rollcap.rollout.inspect import episode_table, load_any, plot_episode

    records = load_any(args.file)
    print(episode_table(records))
    if args.plot is not None:
        args.plot.mkdir(parents=True, exist_ok=True)
        for r in records:
            path = args.plot / f"episode_{r.index:05d}.png"
            plot_episode(r, path)
            print(f"wrote {path}")
    return 0


# ------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    from rollcap.rollout.bench import format_report, run_bench

    parts = _parts(args)
    report = run_bench(parts, quick=args.quick, only=tuple(s for s in args.only.split(",") if s) if args.only else None)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


# -------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rollcap", description="Rollouts for robot policies: captured-graph VLA inference, a concurrent critic, capsule reset, bit-exact recordings.", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run episodes and record them (the main job)", description="Run N episodes of a task with a policy and a critic; record npz + robomimic HDF5; print a summary.", epilog="example: rollcap run --episodes 20 --critic-threshold -0.8 --out runs/eval", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=10, help="episodes to run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="run seed; episode i uses a seed derived from it (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<timestamp>)")
    p.add_argument("--format", default="npz,h5", help="recording formats, comma list of npz,h5 (default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out, appending after its last whole episode")
    p.add_argument("--critic-threshold", type=float, default=None, help="stop an episode when the critic value stays below this (in [-1, 0])")
    p.add_argument("--critic-patience", type=int, default=2, help="... for this many consecutive chunks (default: %(default)s)")
    p.add_argument("--max-chunks", type=int, default=None, help="stop an episode before this chunk index")
    p.add_argument("--max-seconds", type=float, default=None, help="wall-clock limit per episode (not replay-exact)")
    p.add_argument("--execute-steps", type=int, default=None, help="actions of each chunk to execute before re-planning (default: the shipped policy's setting)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_parts_args(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("replay", help="replay recordings and check they are byte-identical", description="Replay recorded episodes in three modes: policy (recorded obs + noise through the captured policy), env (recorded actions from the initial sim state), closed (re-run from the seed). Exit 1 if an episode diverges where exactness is expected.", epilog="example: rollcap replay runs/eval/episodes.hdf5 --mode policy,env", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="npz files, HDF5 files or run directories")
    p.add_argument("--mode", default="policy,env,closed", help="comma list of policy,env,closed (default: all)")
    _add_parts_args(p)
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("inspect", help="print an episode table; plot critic value and actions", description="Print a table of the episodes in an npz file, an HDF5 file or a run directory.", epilog="example: rollcap inspect runs/eval --plot runs/eval/plots", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help="npz file, HDF5 file or run directory")
    p.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write one PNG per episode into DIR (needs matplotlib)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("bench", help="measure latency, overlap, capsules, env and host overhead", description="Measure, in one run: policy chunk latency eager vs captured, critic latency, policy||critic vs serial, capture time, exactness, capsule snapshot/restore, env steps/s, host and recording overhead.", epilog="example: rollcap bench --quick --json bench.json", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument("--quick", action="store_true", help="fewer repeats (for smoke tests)")
    p.add_argument("--only", default=None, help="comma list of sections: models,capsule,env,host")
    _add_parts_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("capsule", help="capsule tools", description="Tools for disk capsules.")
    csub = p.add_subparsers(dest="capsule_command", metavar="COMMAND")
    csub.required = True
    try:
        from rollcap.capsule.cli import add_subparser

        add_subparser(csub)
    except ImportError:  # pragma: no cover - capsule CLI missing
        pass
    return ap


def main(argv: list[str] | None = None) -> int:
    from rollcap.capsule.errors import CapsuleMismatch, CorruptCapsule
    from rollcap.kernels.errors import BadInput, CheckpointMismatch
    from rollcap.rollout.errors import CorruptEpisode

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UserError, BadInput, CheckpointMismatch, CorruptEpisode, CorruptCapsule, CapsuleMismatch, FileNotFoundError, ValueError) as err:
        print(f"rollcap {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rollcap inspect ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
