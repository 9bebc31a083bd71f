r"""Flow-policy RL: GRPO or PPO fine-tunes the FlowVLA itself on the batched envs; then 200 held-out episodes, paired.

    python examples/flow_rl.py --task pushblock --seed 0 --minutes 60 --eval-seed 9002 --out runs/flow/push-0
    python examples/flow_rl.py --task pushblock --algorithm ppo --seed 0 --out runs/flow/push-ppo-0
    python examples/flow_rl.py --out runs/flow/push-0 --resume          # after a Ctrl-C: goes on where it stopped
    python examples/flow_rl.py --minutes 0.5 --groups 2 --group-size 4 --eval-episodes 4 --out /tmp/flow   # smoke

Each iteration plays --groups capsules (initial states of the training stream) x --group-size episodes on one
Flow-SDE graph (their noise differs, their start state is one capsule, byte for byte), updates the policy with
PPO's clipped ratio over every denoising step (advantages: GRPO's group-relative outcome, the branch variant, or
GAE with a value head) and copies the new weights into the captured graph in place (capture count: one per
graph). The plain sampler (the deployed policy) is scored on a held-in stream every --heldin-every iterations and
the best weights are kept. The held-out stream (--eval-seed) is named in the log and in result.json before any
training; after it, the kept policy plays its episodes exactly as `rollcap run --seed EVAL_SEED` does, paired
against the starting policy on the same episodes (--baseline caches the starting side).

Writes to --out: policy.json/.safetensors (the kept weights; policy-last.* when the last differ, scored too), result.json
(config, streams, budget in iterations, episodes, transitions, updates and minutes, the curve, held-in points,
the held-out table), curve.png (with matplotlib), episodes/ and weights/ (every --record-every iterations: the
episodes and the weights each ran with, so `rollcap replay EPISODE --policy WEIGHTS` replays it exactly), and
state/ (what --resume reads). Ctrl-C saves the state and exits 130.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rollcap.kernels.files import write_report
from rollcap.policies.runner import save_policy
from rollcap.rollout.learn.dsrl_eval import TASKS, held_out
from rollcap.rollout.learn.flow_rl import Interrupted, TrainConfig, compare, play, train
from rollcap.rollout.learn.flow_rl.evaluate import line
from rollcap.rollout.learn.flow_rl.loop import BUDGET, start_checkpoint
from rollcap.rollout.learn.flow_rl.rollouts import streams
from rollcap.rollout.options import BadFlag, Options, one_line_parser, writable_dir

OUTPUTS = ("result.json", "policy.json", "state", "streams.json")


@dataclass
class Args:
    out: Path = Path("runs/flow")
    """Directory for the run (result.json, policy.json, episodes/, weights/, state/)."""
    policy: Path | None = None
    """The checkpoint to fine-tune (default: the shipped one for the task)."""
    eval_episodes: int = 200
    """Held-out episodes (0: no held-out evaluation)."""
    eval_seed: int | None = None
    """Held-out run seed (default: the task's, 2 for pushblock and 31337 for peg-insert-side)."""
    baseline: Path | None = None
    """JSON of the starting policy's held-out outcomes (own and zero noise; DSRL's baseline files are this format;
    default: baseline-TASK-SEED-N.json in --out's parent; computed when missing)."""
    resume: bool = False
    """Go on with the run in --out from its saved state (after a Ctrl-C), with the same settings."""
    overwrite: bool = False
    """Replace a run already in --out (default: refuse it)."""


def base_path(args: Args, cfg: TrainConfig, eval_seed: int) -> Path:
    return args.baseline or args.out.parent / f"baseline-{cfg.task}-{eval_seed}-{args.eval_episodes}.json"


def check(args: Args, cfg: TrainConfig) -> int:
    """Every check that needs no training (BadFlag names the flag); returns the held-out run seed."""
    if (
        isinstance(args.eval_episodes, bool)
        or not isinstance(args.eval_episodes, int)
        or not 0 <= args.eval_episodes <= 100_000
    ):
        raise BadFlag("--eval-episodes", f"expected an integer in 0..100000, got {args.eval_episodes!r}")
    try:
        eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    except ValueError as err:
        raise BadFlag("--eval-seed", str(err)) from None
    if args.policy is not None and not Path(args.policy).with_suffix(".json").is_file():
        raise BadFlag("--policy", f"{args.policy}: no such checkpoint (.json beside its .safetensors)")
    writable_dir(args.out, "--out")
    if args.resume:
        if not (args.out / "state" / "state.json").is_file():
            raise BadFlag("--resume", f"{args.out} holds no saved training state (state/state.json)")
    else:
        old = [name for name in OUTPUTS if (args.out / name).exists()]
        if old and not args.overwrite:
            raise BadFlag(
                "--out",
                f"{args.out} already holds {', '.join(old)} (--resume goes on with it; --overwrite replaces it)",
            )
    path = base_path(args, cfg, eval_seed)
    if args.eval_episodes and path.exists():
        try:
            base = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise BadFlag("--baseline", f"{path}: not a readable JSON file ({err})") from None
        ok = isinstance(base, dict) and base.get("task") == cfg.task and base.get("eval_seed") == eval_seed
        if not ok or not isinstance(base.get("frozen"), list) or len(base["frozen"]) < args.eval_episodes:
            got = (
                (base.get("task"), base.get("eval_seed"), len(base.get("frozen") or []))
                if isinstance(base, dict)
                else base
            )
            raise BadFlag("--baseline", f"{path}: holds (task, run seed, episodes) {got}, need {cfg.task!r}, {eval_seed} x {args.eval_episodes}")  # fmt: skip
    elif args.eval_episodes:
        writable_dir(path.parent, "--baseline" if args.baseline else "--out")
    return eval_seed


def plot(result: dict, path: Path, title: str) -> bool:
    """Training success per iteration (the SDE's episodes), the held-in points and the held-out lines."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    curve = result["curve"]
    if curve:
        x = [p["transitions"] for p in curve]
        y = [p["success"] for p in curve]
        k = max(1, len(y) // 40)
        ys = [sum(y[max(0, i - k) : i + 1]) / len(y[max(0, i - k) : i + 1]) for i in range(len(y))]
        ax.plot(x, ys, color="0.6", lw=1, label="training episodes (Flow-SDE, running mean)")
    pts = result["held_in"]
    if pts:
        ax.plot([p["transitions"] for p in pts], [p["success"] / p["episodes"] for p in pts], "o-", color="C0",
                label=f"held-in: plain sampler ({pts[0]['episodes']})")  # fmt: skip
        if result.get("kept"):
            kp = result["kept"]
            ax.plot([kp["transitions"]], [kp["success"] / kp["episodes"]], "*", ms=14, color="C3", label="kept")
    ev = result.get("eval")
    if ev:
        n = ev["own"]["episodes"]
        ax.axhline(ev["own"]["tuned"] / n, color="k", lw=0.8, label=f"held-out: tuned ({n})")
        ax.axhline(ev["own"]["start"] / n, color="k", lw=0.8, ls="--", label="held-out: start")
    ax.set_xlabel("transitions (chunks)")
    ax.set_ylabel("success")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(args: Args, cfg: TrainConfig, eval_seed: int) -> int:
    say = lambda text: print(text, flush=True)  # noqa: E731 (live, also into a pipe or a file)
    task = TASKS[cfg.task]
    start = start_checkpoint(cfg, args.policy)
    report = {"config": cfg.to_json(), "task": vars(task), "start": str(start),
              "streams": streams(cfg.seed, cfg.heldin_episodes if cfg.heldin_every else 0, eval_seed if args.eval_episodes else None, args.eval_episodes)}  # fmt: skip
    say(f"streams (named before training): {json.dumps(report['streams'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.resume:  # what --resume holds the run to: its held-out stream stays the one named here
        named = {**report["streams"], "baseline": str(base_path(args, cfg, eval_seed)) if args.eval_episodes else None}
        write_report(args.out / "streams.json", named)
    try:
        res = train(cfg, args.out, args.policy, say, resume=args.resume)
    except Interrupted as err:
        print(f"{sys.argv[0]}: {err}", file=sys.stderr)
        return 130
    model, last = res.pop("model"), res.pop("last")
    save_policy(model, args.out / "policy.json")
    if (
        last is not None
    ):  # keep-best kept an earlier one: the last weights too, scored beside it (what keeping was worth)
        kept_weights = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(last)
        save_policy(model, args.out / "policy-last.json")
        model.load_state_dict(kept_weights)
    report.update({k: res[k] for k in ("budget", "curve", "held_in", "kept", "recorded", "kept_is_last")})
    write_report(args.out / "result.json", report)
    say(json.dumps(res["budget"]))
    if args.eval_episodes:
        path = base_path(args, cfg, eval_seed)
        if path.exists():
            base = json.loads(path.read_text())
        else:
            got = play(held_out(cfg.task, eval_seed), args.policy, eval_seed, args.eval_episodes, progress=say)
            base = {"task": cfg.task, "eval_seed": eval_seed, "episodes": args.eval_episodes, "frozen": got["own"],
                    "zero_noise": got["zero_noise"], "policy": str(start), "weights": got["weights"]}  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            write_report(path, base)
        n = args.eval_episodes
        tuned = play(held_out(cfg.task, eval_seed), args.out / "policy.json", eval_seed, n, progress=say)
        report["eval"] = {
            "eval_seed": eval_seed, "baseline": str(path), "weights": tuned["weights"],
            "own": compare(tuned["own"], base["frozen"][:n]), "zero_noise": compare(tuned["zero_noise"], base["zero_noise"][:n]),
            "tuned_own_vs_start_zero": compare(tuned["own"], base["zero_noise"][:n]),
            "outcomes": {"tuned_own": tuned["own"], "tuned_zero": tuned["zero_noise"]},
        }  # fmt: skip
        if last is not None:
            got = play(held_out(cfg.task, eval_seed), args.out / "policy-last.json", eval_seed, n, progress=say)
            report["eval"]["last"] = {"own": compare(got["own"], base["frozen"][:n]),
                                      "zero_noise": compare(got["zero_noise"], base["zero_noise"][:n]), "weights": got["weights"],
                                      "kept_vs_last_own": compare(tuned["own"], got["own"])}  # fmt: skip
        write_report(args.out / "result.json", report)
        say(line("held-out, own noise", report["eval"]["own"]))
        say(line("held-out, zero noise", report["eval"]["zero_noise"]))
        say(line("held-out, tuned own noise vs start zero noise", report["eval"]["tuned_own_vs_start_zero"]))
        if last is not None:
            say(line("held-out, the last weights (not kept), own noise", report["eval"]["last"]["own"]))
    plot(report, args.out / "curve.png", f"flow RL ({cfg.algorithm}, {cfg.advantage}) on {cfg.task}, seed {cfg.seed}")
    kept = res["kept"]
    if kept is not None:
        say(f"kept weights from iteration {kept['iteration']} (minute {kept['minutes']:.1f}): {kept['success']}/{kept['episodes']} held-in; -> {args.out / 'policy.json'}")  # fmt: skip
    return 0


def resumed(args: Args, cfg: TrainConfig, opts: Options) -> tuple[TrainConfig, Path | None]:
    """A resumed run's settings: the saved ones (a flag given with another value than the saved one is refused,
    except the budget's: --minutes, --max-iterations, --log-every-s)."""
    path = args.out / "state" / "state.json"
    try:
        meta = json.loads(path.read_text())["meta"]
        saved = TrainConfig(**meta["config"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadFlag("--resume", f"{path}: not a readable training state ({err})") from None
    default, given = TrainConfig().to_json(), cfg.to_json()
    for name, value in given.items():
        if name not in BUDGET and value != default[name] and value != getattr(saved, name):
            raise BadFlag(opts.flag(name) or name, f"the run in {args.out} was saved with {getattr(saved, name)!r}; a resumed run keeps its settings")  # fmt: skip
    keep = {k: given[k] if given[k] != default[k] else getattr(saved, k) for k in BUDGET}
    held = _saved_held_out(args.out)
    if held is not None:  # the held-out stream named before training, not this call's default
        for flag, name, key in (
            ("--eval-seed", "eval_seed", "run_seed"),
            ("--eval-episodes", "eval_episodes", "episodes"),
        ):
            given, default = getattr(args, name), getattr(Args, name)
            if given != default and given != held[key]:
                raise BadFlag(flag, f"the run in {args.out} named {held[key]} before training; a resumed run keeps it")
            setattr(args, name, held[key])
        if args.baseline is None and held.get("baseline"):  # the starting side the run was to be paired with
            args.baseline = Path(held["baseline"])
    policy = Path(meta["start"]) if args.policy is None else args.policy
    if str(start_checkpoint(saved, policy)) != meta["start"]:
        raise BadFlag("--policy", f"the run in {args.out} started from {meta['start']}")
    return replace(saved, **keep), policy


def _saved_held_out(out: Path) -> dict | None:
    """The held-out stream (and baseline) ``out``'s run named before training (``streams.json``); None without one."""
    path = out / "streams.json"
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        held = saved.get("held_out")
    except (OSError, ValueError, AttributeError) as err:
        raise BadFlag("--resume", f"{path}: not a readable JSON file ({err})") from None
    if not (isinstance(held, dict) and "run_seed" in held and "episodes" in held):
        held = {"run_seed": None, "episodes": 0}
    return {**held, "baseline": saved.get("baseline")}


def parse(argv=None) -> tuple[Args, TrainConfig, int]:
    """The flags, every one checked before anything trains: a bad one is one line naming it, exit 2."""
    ap = one_line_parser(__doc__)
    opts = Options(ap)
    opts.add(Args)
    opts.add(TrainConfig)
    ns = ap.parse_args(argv)
    try:
        try:
            cfg = TrainConfig(**opts.values(ns, TrainConfig))
        except ValueError as err:  # "field: what"
            name, _, what = str(err).partition(":")
            raise BadFlag(opts.flag(name) or name, what.strip()) from None
        args = Args(**opts.values(ns, Args))
        if args.resume:
            cfg, args.policy = resumed(args, cfg, opts)
        eval_seed = check(args, cfg)
    except BadFlag as err:
        ap.error(str(err))
    return args, cfg, eval_seed


if __name__ == "__main__":
    sys.exit(main(*parse()))
