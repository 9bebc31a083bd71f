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
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rollcap.rollout.cli.options import Options
from rollcap.rollout.learn.dsrl_na import TASKS, TrainConfig, baseline, evaluate, held_out, summary_lines, train
from rollcap.rollout.learn.noise_agent import AgentConfig


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


def plot(curve: list[dict], result: dict, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    pts = [(p["transitions"], p["train_success_last100"]) for p in curve if p["train_success_last100"] is not None]
    if pts:
        ax.plot(*zip(*pts), label="training episodes (last 100, stochastic noise)")
    n = result["episodes"]
    for key, style in (("steered", "-"), ("frozen", "--"), ("zero_noise", ":")):
        ax.axhline(
            result[f"{key}_success"] / n,
            linestyle=style,
            color="k" if key == "steered" else "grey",
            label=f"held-out {key.replace('_', ' ')} ({n} episodes)",
        )
    ax.set_xlabel("transitions (chunks)")
    ax.set_ylabel("success")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main(args: Args, cfg: TrainConfig) -> None:
    from safetensors.torch import save_file

    eval_seed = held_out(cfg.task, args.eval_seed).eval_seed
    base_path = args.baseline or args.out.parent / f"baseline-{cfg.task}-{eval_seed}-{args.eval_episodes}.json"
    if base_path.exists():
        base = json.loads(base_path.read_text())
        if (
            base.get("task") != cfg.task
            or base.get("episodes", 0) < args.eval_episodes
            or base.get("eval_seed") != eval_seed
        ):
            raise SystemExit(
                f"--baseline {base_path}: holds {base.get('task')!r} x {base.get('episodes')} episodes of run seed {base.get('eval_seed')}, "
                f"need {cfg.task!r} x {args.eval_episodes} of run seed {eval_seed}"
            )
    agent, info = train(cfg)
    print(json.dumps(info["budget"]))
    if base_path.exists():  # read again: another run may have written it while this one trained
        base = json.loads(base_path.read_text())
    else:
        base = baseline(cfg.task, args.eval_episodes, eval_seed=eval_seed)
        base_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = base_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(base))
        tmp.replace(base_path)
    result = evaluate(agent, cfg.task, args.eval_episodes, base, cfg.agent.gamma)
    print("\n".join(summary_lines(result)))
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in agent.state_dict().items()}, str(args.out / "agent.safetensors"))
    report = {
        "config": cfg.to_json(),
        "task": vars(TASKS[cfg.task]),
        "baseline": str(base_path),
        "budget": info["budget"],
        "curve": info["curve"],
        "eval": result,
    }
    (args.out / "result.json").write_text(json.dumps(report, indent=1, default=str))
    plot(
        info["curve"],
        result,
        args.out / "curve.png",
        f"DSRL-{cfg.agent.algorithm.upper()} on {cfg.task}, seed {cfg.seed}",
    )
    print(f"-> {args.out / 'result.json'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    opts = Options(ap)
    opts.add(Args)
    opts.add(TrainConfig, skip=("agent",))
    opts.add(AgentConfig)
    ns = ap.parse_args()
    try:
        config = TrainConfig(**opts.values(ns, TrainConfig), agent=AgentConfig(**opts.values(ns, AgentConfig)))
        held_out(config.task, opts.values(ns, Args)["eval_seed"])
    except ValueError as err:
        ap.error(str(err))
    main(Args(**opts.values(ns, Args)), config)
    sys.exit(0)
