r"""DSRL on the batched vector env: a noise agent steers a frozen flow policy; scored on held-out episodes, paired.

    python examples/dsrl.py --task peg-insert-side --seed 0 --out runs/dsrl/peg-na-0     # DSRL-NA, 15 min, then 200 held-out
    python examples/dsrl.py --task pushblock --algorithm sac --seed 0 --out runs/dsrl/push-sac-0
    python examples/dsrl.py --task pushblock --minutes 0.2 --eval-episodes 4 --out /tmp/dsrl  # smoke

--algorithm na (DSRL-NA: a critic on the executed chunk, distilled into a noise critic the actor climbs; nothing
bootstraps through the noise) or sac (noise-space SAC). Training runs --num-envs sub-envs on one policy graph
(rollcap.rollout.gym.vector); the held-out side is batch 1: the actor's deterministic noise, the frozen policy
(exactly `rollcap run --seed EVAL_SEED` of the task) and all-zero noise, on episodes episode_seed(EVAL_SEED, i).
The frozen and zero-noise outcomes do not depend on the agent: --baseline caches them (computed and written when
the file is missing). Writes result.json (config, learning curve, budget, held-out table, the critic against
Monte-Carlo returns, the noise it picks), agent.safetensors and curve.png (with matplotlib) to --out.

--snapshot-minutes M also scores, on the same held-out episodes, the agent a run of M minutes would have ended with
(agent-snapshot.safetensors: a 15-minute and a 60-minute result from one run). When keep-best kept an earlier agent
than the last, the last one is scored too (agent-last.safetensors), so what keeping it was worth is measured.

--load RUN/agent.safetensors evaluates a saved agent instead of training one (its run's result.json names the task,
view and agent), on the same held-out episodes; the result goes to --out's result.json. --tensorboard DIR also writes
the training curve and the held-in checkpoints as TensorBoard event files (tensorboard --logdir DIR).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save

from rollcap.rollout.options import BadFlag, Options, one_line_parser, writable_dir
from rollcap.rollout.learn.dsrl_heldin import kept_line, streams, weights
from rollcap.rollout.learn.dsrl_eval import TASKS, baseline, evaluate, held_out, summary_lines
from rollcap.rollout.learn.dsrl_na import TrainConfig, train
from rollcap.rollout.learn.logs import add_scalars, summary_writer, tensorboard_missing
from rollcap.rollout.learn.noise_agent import AgentConfig, NoiseAgent

OUTPUTS = ("result.json", "agent.safetensors", "curve.png", "agent-snapshot.safetensors", "agent-last.safetensors")


@dataclass
class Args:
    out: Path = Path("runs/dsrl")
    """Directory for result.json, agent.safetensors and curve.png."""
    eval_episodes: int = 200
    """Held-out episodes (steered; the frozen and zero-noise sides come from --baseline)."""
    eval_seed: int | None = None
    """Held-out run seed (default: the task's, 2 for pushblock and 31337 for peg-insert-side)."""
    baseline: Path | None = None
    """JSON of the frozen and zero-noise outcomes on the held-out seeds (default: baseline-TASK-SEED-N.json in --out's parent; computed when missing)."""
    overwrite: bool = False
    """Replace a result already in --out (default: refuse it)."""
    load: Path | None = None
    """Evaluate this saved agent instead of training one: an agent*.safetensors this script wrote, its run's result.json beside it (task, view, agent); the result goes to --out."""
    tensorboard: Path | None = None
    """Also write the training curve and the held-in checkpoints as TensorBoard event files here."""


def base_path(args: Args, cfg: TrainConfig) -> Path:
    eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    return args.baseline or args.out.parent / f"baseline-{cfg.task}-{eval_seed}-{args.eval_episodes}.json"


def saved_run(path: Path) -> TrainConfig:
    """The training config of the run that saved the agent at ``path`` (its result.json); BadFlag for --load."""
    if path.suffix != ".safetensors" or not path.is_file():
        raise BadFlag("--load", f"{path}: expected an agent*.safetensors file this script wrote")
    try:
        saved = json.loads((path.parent / "result.json").read_text())["config"]
        agent = AgentConfig(**saved.pop("agent"))
        return TrainConfig(**saved, agent=agent)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BadFlag("--load", f"{path.parent / 'result.json'}: no training config of this script's ({err})") from None


def load_agent(path: Path, cfg: TrainConfig):
    """The saved agent at ``path`` (BadFlag for --load when its weights do not fit its config)."""
    from safetensors.torch import load_file

    try:
        return NoiseAgent.from_state(load_file(str(path)), cfg.agent)
    except (OSError, ValueError) as err:
        raise BadFlag("--load", f"{path}: {err}") from None


def check(args: Args, cfg: TrainConfig) -> None:
    """Every check that needs no training: BadFlag names the flag."""
    if args.tensorboard is not None and tensorboard_missing():
        raise BadFlag("--tensorboard", tensorboard_missing())
    if not isinstance(args.eval_episodes, int) or args.eval_episodes < 1:
        raise BadFlag("--eval-episodes", f"expected an integer >= 1, got {args.eval_episodes!r}")
    try:
        eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    except ValueError as err:
        raise BadFlag("--eval-seed", str(err)) from None
    writable_dir(args.out, "--out")
    old = [name for name in OUTPUTS if (args.out / name).exists()]
    if old and not args.overwrite:
        raise BadFlag("--out", f"{args.out} already holds {', '.join(old)} (pass --overwrite to replace it)")
    path = base_path(args, cfg)
    if path.exists():
        try:
            base = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise BadFlag("--baseline", f"{path}: not a readable JSON file ({err})") from None
        if not isinstance(base, dict) or base.get("task") != cfg.task or not isinstance(base.get("episodes"), int) or base["episodes"] < args.eval_episodes or base.get("eval_seed") != eval_seed:  # fmt: skip
            got = (base.get("task"), base.get("episodes"), base.get("eval_seed")) if isinstance(base, dict) else base
            raise BadFlag("--baseline", f"{path}: holds (task, episodes, run seed) {got}, need {cfg.task!r} x {args.eval_episodes} of run seed {eval_seed}")  # fmt: skip
    else:
        writable_dir(path.parent, "--baseline" if args.baseline else "--out")


def write(path: Path, data: bytes) -> None:
    """Atomically, with the mode every other output gets (0666 less the umask: 0644 by default)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def plot(info: dict, result: dict, path: Path, title: str) -> bool:
    """Success over transitions (held-in: the agent, zero noise, own noise; training episodes; held-out lines), and
    the actor's entropy and its coefficient below."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(2, 1))
    curve, points = info["curve"], info["held_in"]
    pts = [(p["transitions"], p["train_success_last100"]) for p in curve if p["train_success_last100"] is not None]
    if pts:
        ax.plot(*zip(*pts), color="0.6", lw=1, label="training episodes (last 100, sampled noise)")
    if points:
        x = [p["transitions"] for p in points]
        for key, style, label in (("success", "o-", "held-in: the agent"), ("zero_noise", ":", "held-in: zero noise"), ("own_noise", "--", "held-in: own noise")):  # fmt: skip
            ax.plot(x, [p[key] / p["episodes"] for p in points], style, color="C0" if key == "success" else "C1", label=f"{label} ({points[0]['episodes']})")  # fmt: skip
        if info.get("snapshot") is not None:
            ax.axvline(info["snapshot"]["budget"]["transitions"], color="0.4", lw=0.8, ls="-.", label=f"snapshot (minute {info['snapshot']['minutes']:g})")  # fmt: skip
        if info["kept"] is not None:
            k = info["kept"]
            ax.plot([k["transitions"]], [k["success"] / k["episodes"]], "*", ms=14, color="C3", label="kept")
        ent = [(p["transitions"], p["entropy"]) for p in points if p["entropy"] is not None]
        if ent:
            bx.plot(*zip(*ent), "o-", color="C2", label="entropy (nats)")
        cx = bx.twinx()
        cx.semilogy(x, [p["alpha"] for p in points], "s--", color="C4", label="alpha")
        cx.set_ylabel("alpha")
        cx.legend(fontsize=7, loc="upper right")
    n = result["episodes"]
    for key, style in (("steered", "-"), ("frozen", "--"), ("zero_noise", ":")):
        ax.axhline(result[f"{key}_success"] / n, linestyle=style, color="k", lw=0.8, label=f"held-out {key.replace('_', ' ')} ({n})")  # fmt: skip
    ax.set_ylabel("success")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    bx.set_xlabel("transitions (chunks)")
    bx.set_ylabel("entropy")
    if not points:  # no held-in checkpoints (--heldin-every 0): the entropy the training log printed
        ent = [(p["transitions"], p["entropy"]) for p in curve if p.get("entropy") is not None]
        if ent:
            bx.plot(*zip(*ent), "-", color="C2", label="entropy (nats, training log)")
    if bx.get_legend_handles_labels()[0]:
        bx.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def baseline_for(args: Args, cfg: TrainConfig, eval_seed: int) -> dict:
    """The frozen and zero-noise outcomes on the held-out seeds: read from --baseline, or computed and written there."""
    path = base_path(args, cfg)
    if path.exists():
        return json.loads(path.read_text())
    base = baseline(cfg.task, args.eval_episodes, eval_seed=eval_seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, json.dumps(base).encode())
    return base


def evaluate_only(args: Args, cfg: TrainConfig) -> None:
    """--load: the saved agent on the held-out episodes, paired against the frozen policy and zero noise."""
    eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    agent = load_agent(args.load, cfg)
    print(
        f"evaluating {args.load} (task {cfg.task}, view {cfg.view}, DSRL-{cfg.agent.algorithm.upper()}, from its result.json)"
    )
    result = evaluate(
        agent, cfg.task, args.eval_episodes, baseline_for(args, cfg, eval_seed), cfg.agent.gamma, cfg.view
    )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"loaded": str(args.load), "config": cfg.to_json(), "baseline": str(base_path(args, cfg)), "eval": result}
    write(args.out / "result.json", json.dumps(report, indent=1, default=str).encode())
    print("\n".join(summary_lines(result)))
    print(f"-> {args.out / 'result.json'}")


def main(args: Args, cfg: TrainConfig) -> None:
    if args.load is not None:
        return evaluate_only(args, cfg)
    eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    path = base_path(args, cfg)
    writer = summary_writer(args.tensorboard) if args.tensorboard is not None else None
    scalars = None if writer is None else (lambda prefix, point, step: add_scalars(writer, prefix, point, step))
    try:  # the progress lines go out live, also into a pipe or a file
        agent, info = train(cfg, progress=lambda text: print(text, flush=True), scalars=scalars)
    finally:
        if writer is not None:
            writer.close()
    print(json.dumps(info["budget"]))
    # the training is kept before anything is evaluated: an evaluation that fails leaves the agent and its curves
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "agent.safetensors", save({k: v.contiguous() for k, v in agent.state_dict().items()}))
    others = {}  # the other agents scored on held-out: the snapshot's and the last one
    snap, last = info.get("snapshot"), info.get("last")
    if snap is not None:
        # the snapshot's kept agent may be the run's kept one (no better checkpoint came later): scored once
        same = snap["kept"] is not None and snap["kept"] is info["kept"]
        others["snapshot"] = (
            {"minutes": snap["minutes"], "kept": snap["kept"], "budget": snap["budget"], "same_as_kept": same},
            snap["state"],
        )
    if last is not None:
        others["last"] = ({"point": last["point"]}, last["state"])
    for name, (_, state) in others.items():
        write(args.out / f"agent-{name}.safetensors", save({k: v.contiguous() for k, v in state.items()}))
    report = {
        "config": cfg.to_json(),
        "task": vars(TASKS[cfg.task]),
        "streams": streams(cfg.seed, cfg.num_envs, cfg.heldin_episodes if cfg.heldin_every else 0, eval_seed, args.eval_episodes),
        "baseline": str(path),
        "budget": info["budget"],
        "curve": info["curve"],
        "held_in": info["held_in"],
        "kept": info["kept"],
        "eval": None,
        **{name: {**meta, "eval": None} for name, (meta, _) in others.items()},
    }  # fmt: skip
    write(args.out / "result.json", json.dumps(report, indent=1, default=str).encode())
    base = baseline_for(args, cfg, eval_seed)
    report["eval"] = result = evaluate(agent, cfg.task, args.eval_episodes, base, cfg.agent.gamma, cfg.view)
    write(args.out / "result.json", json.dumps(report, indent=1, default=str).encode())
    kept_state = weights(agent)
    for name, (meta, state) in others.items():
        if meta.get("same_as_kept"):
            report[name]["eval"] = result
        else:
            agent.load_state_dict(state)
            report[name]["eval"] = evaluate(agent, cfg.task, args.eval_episodes, base, cfg.agent.gamma, cfg.view)
        write(args.out / "result.json", json.dumps(report, indent=1, default=str).encode())
    agent.load_state_dict(kept_state)
    title = f"DSRL-{cfg.agent.algorithm.upper()} on {cfg.task}, seed {cfg.seed}"
    plot(info, result, args.out / "curve.png", title)
    print("\n".join(summary_lines(result)))
    for name, label in (
        ("snapshot", f"the {cfg.snapshot_minutes:g}-minute snapshot"),
        ("last", "the last agent (not kept)"),
    ):
        if name in others:
            print(f"{label}:")
            print("\n".join("  " + text for text in summary_lines(report[name]["eval"])))
    print(f"-> {args.out / 'result.json'}")
    if info["kept"] is not None:
        print(kept_line(info["kept"]))


def parse(argv=None) -> tuple[Args, TrainConfig]:
    """The flags, every one checked before anything trains: a bad one is one line naming it, exit 2."""
    ap = one_line_parser(__doc__)
    opts = Options(ap)
    opts.add(Args)
    opts.add(TrainConfig, skip=("agent",))
    opts.add(AgentConfig)
    ns = ap.parse_args(argv)
    try:
        try:
            cfg = TrainConfig(**opts.values(ns, TrainConfig), agent=AgentConfig(**opts.values(ns, AgentConfig)))
        except ValueError as err:  # "field: what"
            name, _, what = str(err).partition(":")
            raise BadFlag(opts.flag(name) or name, what.strip()) from None
        args = Args(**opts.values(ns, Args))
        if args.load is not None:  # the saved run's task, view and agent, not the flags' defaults
            cfg = saved_run(args.load)
        check(args, cfg)
    except BadFlag as err:
        ap.error(str(err))
    return args, cfg


if __name__ == "__main__":
    main(*parse())
    sys.exit(0)
