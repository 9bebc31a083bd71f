"""The ``rollcap`` command line: run, replay, inspect, export, branch, recap, bench, capsule inspect.

Building the parser imports no torch (``rollcap --help`` and ``rollcap COMMAND --help`` answer in a fraction of a
second): it needs the spec's dataclasses only; each command imports what it runs (the API, the benches) when it
runs. ``tests/rollout/cli/test_startup.py`` guards this.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rollcap.rollout.bench.batch_options import add_batch_arguments, batch_options

from rollcap.capsule.cli import add_subparser as add_capsule_parser
from rollcap.rollout.cli.branch import add_parser as add_branch_parser
from rollcap.rollout.cli.merge import add_parser as add_merge_parser
from rollcap.rollout.options import Options, UserError, field_docs
from rollcap.rollout.cli.recap import add_parser as add_recap_parser
from rollcap.rollout.cli.recordings import add_parsers as add_recordings_parsers
from rollcap.rollout.cli.signals import SIGNALS as _SIGNALS, Terminated as _Terminated
from rollcap.rollout.offline.deployment import AS_RECORDED
from rollcap.rollout.config import HostConfig
from rollcap.rollout.spec import Parts, RunConfig, Spec, usable_cores
from rollcap.rollout.stats import rate_line

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


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``rollcap run: error: --episodes: invalid int value: 'x'`` and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message.replace('argument ', '', 1)} (see --help)\n")

    def parse_args(self, args=None, namespace=None):
        """Flags no command takes are refused by that command's parser, so the error names it (``rollcap replay:``)."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            getattr(ns, "subparser", self).error(f"unrecognized arguments: {' '.join(extra)}")
        return ns


# --------------------------------------------------------------------- run
def _parts_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = (), as_recorded: bool = False):
    """The Parts flags; ``as_recorded`` (replay, branch): device, backend, precision, sampler, policy and critic default to the recording's."""
    opts = Options(p)
    said = " Default: the recording's, where this machine has it."
    docs = {} if not as_recorded else {f: _first_sentence(Parts, f) + said for f in AS_RECORDED}
    opts.add(Parts, skip=skip, help=docs, unset=AS_RECORDED if as_recorded else ())
    return opts


def _first_sentence(cls, field: str) -> str:
    doc = field_docs(cls).get(field, "")
    head = doc.split(" (default")[0].split("; default")[0].rstrip(".")
    return head + ")" * (head.count("(") - head.count(")")) + "."  # a parenthesis the cut left open is closed


def _run_options(p: argparse.ArgumentParser):
    opts = _parts_options(p)
    opts.add(RunConfig)
    opts.add(HostConfig)
    return opts


def cmd_run(args) -> int:
    from rollcap.rollout.api import Interrupted, run
    from rollcap.rollout.build import for_this_machine

    _SIGNALS.poll()  # the heavy imports are done: a Ctrl-C held during them stops here, not after the build and capture
    opts = args.options
    spec = Spec(*(cls(**opts.values(args, cls)) for cls in (Parts, HostConfig, RunConfig)))
    said = None
    if spec.run.env_workers == "auto":  # (the default): it depends on the machine
        spec = for_this_machine(spec)
        n, envs = spec.run.env_workers, spec.run.envs
        where = f"{n} env worker(s)" if n else "every env in this process"
        said = f"rollcap: --env-workers auto: {where} ({usable_cores()} cores, --envs {envs})" if envs > 1 else None

    def started() -> None:  # say what auto chose once the run starts (a run refused in start-up says only why)
        if said is not None:
            print(said, file=sys.stderr)
        _SIGNALS.release()

    try:  # run() builds from names and paths (rollcap.rollout.build) and releases a Ctrl-C held in start-up once it is over
        result = run(spec, on_started=started, on_finished=_SIGNALS.finish, poll_stop=_SIGNALS.poll)
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
    print(_summary_table(result.summary))
    failed = result.summary.get("failed")
    if failed:  # episodes whose every try killed its actor or env worker (or raised there): not recorded
        where = "env workers" if result.summary.get("env_workers") else "actors"
        print(
            f"rollcap run: error: {len(failed)} episode(s) failed on the {where} ({', '.join(failed)}): {next(iter(failed.values()))}; --resume runs them again",
            file=sys.stderr,
        )
        return 1
    return 0


def _ms(x: float) -> str:
    return f"{x:.2f} ms" if math.isfinite(x) else "-"  # NaN: nothing was timed (no critic, no chunk)


def _summary_table(s: dict) -> str:
    rows = [
        ("run directory", s["run_dir"]),
        ("episodes", str(s["episodes"])),
        ("success rate", rate_line(s["successes"], s["episodes"]) + " (Wilson 95%)" if s["episodes"] else "-"),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in s["stop_reasons"].items()) or "-"),
        ("chunks", str(s["chunks"])),
        ("chunk boundary", f"median {_ms(s['boundary_ms_median'])}, p99 {_ms(s['boundary_ms_p99'])}"),
        ("policy | critic", f"median {_ms(s['policy_ms_median'])} | {_ms(s['critic_ms_median'])}"),
        ("wall", f"{s['wall_s']:.1f} s"),
    ]
    if s.get("discarded_by_key"):
        n, which = len(s["discarded_by_key"]), ", ".join(map(str, s["discarded_by_key"]))
        rows.append(("discarded by key", f"{n} (episode{'s' if n > 1 else ''} {which}; not recorded)"))
    if s.get("env_workers"):
        r, again, kept = s.get("worker_restarts", 0), s.get("lost_and_rerun", []), s.get("kept_from_lost_workers", [])
        lost = (
            f"; episodes of lost workers: {len(again)} run again, {len(kept)} kept as written" if again or kept else ""
        )
        rows.append(("env workers", f"{s['env_workers']}" + (f", {r} restarted" if r else "") + lost))
    if "actors" in s:
        rows.append(
            (
                "ray actors",
                f"{s['actors']} on {s['nodes']} node(s) ({s['address']}), {s['retries']} retried, {len(s['failed'])} failed; start-up {s['actors_start_s']:.1f} s",
            )
        )
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


# ------------------------------------------------------------------- bench
def cmd_bench(args) -> int:
    from rollcap.rollout.bench.ray import format_report as format_ray, run_bench as run_ray
    from rollcap.rollout.bench.report import format_report, run_bench

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
        p.set_defaults(func=func, subparser=p)
        return p

    p = command(
        "run",
        cmd_run,
        "run episodes and record them (the main job)",
        "Run N episodes of a task with a policy and a critic; record npz + robomimic HDF5; print a summary.",
        "rollcap run --episodes 20 --critic-threshold -0.8 --out runs/eval",
    )
    p.set_defaults(options=_run_options(p))

    add_recordings_parsers(command, _parts_options)

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
        help="comma list of sections: models,capsule,env,host,gym,branch,scaling,peer,recording,startup; opt-in: backends (the CPU plans jit/aoti/compile side by side; minutes on a cold compile cache), batch (envs 1 and 8, in this process and in env workers, the shipped policy and a 4 ms stand-in, recorded; --batch-*; ~4 min)",
    )
    add_batch_arguments(p)
    p.add_argument(
        "--policy-size",
        default=None,
        metavar="LIST",
        help="section models: comma list of FlowVLA sizes (shipped,26m,205m,300m,3b, or a config .json) swept with random weights, plain and fused, eager vs the --backend's graph at --precision (default: shipped,26m on CPU, all on a GPU; --quick on CPU: shipped)",
    )
    p.set_defaults(options=_parts_options(p))

    add_branch_parser(command, _parts_options)
    add_recap_parser(command)
    add_merge_parser(command)

    p = sub.add_parser("capsule", help="capsule tools", description="Tools for disk capsules.")
    csub = p.add_subparsers(dest="capsule_command", metavar="COMMAND", parser_class=_Parser)
    csub.required = True
    add_capsule_parser(csub)
    return ap
