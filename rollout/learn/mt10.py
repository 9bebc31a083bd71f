"""Train one FlowVLA for MetaWorld's MT10 tasks from the scripted experts (state + instruction, no images).

One command, seeded end to end (no global RNG but torch's parameter init, which is seeded here)::

    OMP_NUM_THREADS=1 nice -n 5 python3 -m rollcap.rollout.learn.mt10

writes ``policies/weights/mt10_policy.{json,safetensors}`` and ``mt10_training_report.json`` beside them.

Demonstrations (DART): each MT10 task's ``metaworld.policies`` expert (:class:`~rollcap.envs.experts.MetaWorldScript`)
drives ``rollcap/MetaWorld-<task>`` (``render_images=False``) with Gaussian noise on the executed action (std
alternating over :attr:`MT10Config.noise` by episode, clipped to [-1, 1]); every visited step is labelled with the
*clean* expert's actions at that step and the next ``horizon - 1`` visited steps (the expert reads the observation
only, so its clean action at a visited state costs one call; no simulating ahead, whose state copy costs ~60 ms on
MetaWorld). Past the episode's end the last clean action is repeated. Every label is the expert's, so every sample's
advantage indicator is positive (the RECAP dropout still trains the unconditioned branch).

The env and expert are driven directly rather than through ``rollcap.run``: the same env and expert (``--policy
expert:STD`` is this expert plus the host's noise), without the recording the labels do not need.
Episode seeds are ``episode_seed(seed + 1 + task_index, i)``: disjoint from any ``rollcap run --seed S`` whose run
seed is not one of those (the held-out evaluation uses 31337; :func:`collect` refuses it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from rollcap.rollout.options import parse_config
from rollcap.envs.experts import MetaWorldScript
from rollcap.envs.metaworld import INSTRUCTIONS, MT10, STATE_DIM, make_metaworld_env
from rollcap.policies import ADV_POSITIVE, FlowVLA, FlowVLAConfig, save_policy, tokenize
from rollcap.rollout.learn.training import Demos, _batches, optimise
from rollcap.rollout.seeding import episode_seed

HELD_OUT_SEED = 31337
"""The run seed of the held-out evaluation (``rollcap run --seed 31337``): never a training run seed."""

POLICY = FlowVLAConfig(
    image_keys=(), state_dim=STATE_DIM, action_dim=4, horizon=8, state_group=3, max_tokens=48,
    width=64, depth=2, heads=4, num_steps=10, execute_steps=4,
)  # fmt: skip
"""The MT10 policy: no cameras, MetaWorld's 39 numbers as 13 tokens of 3, MT10's instructions (<= 42 bytes) in 48 tokens."""


@dataclass(frozen=True)
class MT10Config:
    """Knobs of :func:`train_mt10`."""

    seed: int = 0
    """Run seed: demonstrations, initialisation and batches derive from it."""
    demos_per_task: int = 150
    """Expert episodes per task."""
    noise: tuple[float, ...] = (0.1, 0.3)
    """Execution noise std (in action units), episode ``i`` uses ``noise[i % len(noise)]``."""
    steps: int = 12000
    """Optimiser steps."""
    batch: int = 64
    """Batch size."""
    lr: float = 1e-3
    """AdamW learning rate (one-cycle)."""
    threads: int = 1
    """Intra-op threads for training."""
    tasks: tuple[str, ...] = MT10
    """Tasks to train on (default: MT10)."""
    policy: FlowVLAConfig = field(default_factory=lambda: POLICY)

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 40:
            raise ValueError(
                f"--steps: expected an int >= 40 (the one-cycle warm-up is 5% of them), got {self.steps!r}"
            )
        for name in ("demos_per_task", "batch", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected an int >= 1, got {v!r}")
        if not self.noise or any(not 0.0 <= s < 10.0 for s in self.noise):
            raise ValueError(f"--noise: expected stds in [0, 10), got {list(self.noise)}")
        if not self.tasks or any(t not in MT10 for t in self.tasks):
            raise ValueError(f"--tasks: expected MT10 tasks ({', '.join(MT10)}), got {list(self.tasks)}")
        if self.lr <= 0:
            raise ValueError(f"--lr: expected > 0, got {self.lr}")


@dataclass
class MT10Demos:
    """Flat per-step arrays over all demonstrations, and per-episode outcomes."""

    state: np.ndarray  # [N, 39] float32
    tokens: np.ndarray  # [N, T] int64
    chunks: np.ndarray  # [N, H, 4] float32
    per_task: dict  # task -> {"episodes", "successes", "steps"}
    value: np.ndarray | None = (
        None  # [N] float32: the critic's target, -(steps to success) / max_steps, -1 in a failed episode
    )
    episode_success: np.ndarray | None = None  # [E] bool
    executed: np.ndarray | None = (
        None  # [N, H, 4] float32: the noisy actions executed at steps t .. t+H-1 (past the end as chunks)
    )


def run_seeds(cfg: MT10Config) -> list[int]:
    """The run seeds the demonstrations derive from (one per task of :data:`MT10` order)."""
    return [cfg.seed + 1 + MT10.index(t) for t in cfg.tasks]


def collect(cfg: MT10Config, log=print) -> MT10Demos:
    """Run each task's expert with execution noise; label every visited step with the clean expert's next chunk."""
    h = cfg.policy.horizon
    if HELD_OUT_SEED in run_seeds(cfg):
        raise ValueError(f"--seed: {cfg.seed} makes run seed {HELD_OUT_SEED}, the held-out evaluation's")
    states, tokens, chunks, values, outcomes, executed, per_task = [], [], [], [], [], [], {}
    for task, run_seed in zip(cfg.tasks, run_seeds(cfg)):
        t0 = time.perf_counter()
        env = make_metaworld_env(task, render_images=False)
        expert = MetaWorldScript(task)
        toks = tokenize(INSTRUCTIONS[task], cfg.policy.max_tokens)
        wins = steps = 0
        for i in range(cfg.demos_per_task):
            seed = episode_seed(run_seed, i)
            rng = np.random.default_rng(seed)
            std = cfg.noise[i % len(cfg.noise)]
            obs, _ = env.reset(seed=seed)
            ep_states, clean, done = [], [], []
            success = False
            while True:
                a = expert.act(obs)
                ep_states.append(obs["state"])
                clean.append(a)
                noisy = np.clip(a + rng.normal(0.0, std, a.shape), -1.0, 1.0).astype(np.float32)
                done.append(noisy)
                obs, _, term, trunc, info = env.step(noisy)
                if info.get("is_success"):
                    success = True
                    break
                if term or trunc:
                    break
            n = len(clean)
            padded = np.concatenate([np.asarray(clean, np.float32), np.repeat(clean[-1][None], h - 1, 0)])
            idx = np.arange(n)[:, None] + np.arange(h)[None, :]
            states.append(np.asarray(ep_states, np.float32))
            chunks.append(padded[idx])
            executed.append(np.concatenate([np.asarray(done, np.float32), padded[n:]])[idx])
            tokens.append(np.repeat(toks[None], n, 0))
            values.append(
                -(n - np.arange(n, dtype=np.float32)) / env.unwrapped.max_path_length
                if success
                else np.full(n, -1.0, np.float32)
            )
            outcomes.append(success)
            wins += success
            steps += n
        env.close()
        per_task[task] = {
            "episodes": cfg.demos_per_task,
            "successes": wins,
            "steps": steps,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        log(
            f"{task}: {wins}/{cfg.demos_per_task} expert episodes succeeded, {steps} steps ({time.perf_counter() - t0:.1f} s)"
        )
    return MT10Demos(np.concatenate(states), np.concatenate(tokens), np.concatenate(chunks), per_task,
                     np.concatenate(values).astype(np.float32), np.array(outcomes, bool), np.concatenate(executed))  # fmt: skip


def recap_demos(
    tasks: list[str], demos: int, seed: int, policy_cfg: FlowVLAConfig | None = None
) -> tuple[Demos, set[int], str]:
    """``demos`` DART demonstrations split evenly over ``tasks`` (at least one each) as RECAP mixes them in
    (:func:`rollcap.rollout.learn.recap.collect.demonstrations`): a state-only :class:`~rollcap.rollout.learn.training.Demos`
    (``images`` ``[N, 0]``, every sample advantage-positive), their episode seeds, and the rule that regenerates them.
    With ``seed`` 0 and 150 a task they are what the shipped MT10 policy was trained on."""
    per = max(1, -(-demos // len(tasks)))
    cfg = MT10Config(
        seed=seed, demos_per_task=per, tasks=tuple(t for t in MT10 if t in tasks), policy=policy_cfg or POLICY
    )
    d = collect(cfg, log=lambda line: None)
    seeds = {episode_seed(r, i) for r in run_seeds(cfg) for i in range(per)}
    adv = np.full(len(d.state), ADV_POSITIVE, np.int64)
    rule = f"learn.mt10.collect(MT10Config(seed={seed}, demos_per_task={per}, tasks={list(cfg.tasks)}))"
    return (
        Demos(np.zeros((len(d.state), 0), np.uint8), d.state, d.tokens, d.chunks, d.value, adv, d.episode_success),
        seeds,
        rule,
    )


def train(d: MT10Demos, cfg: MT10Config, log=print) -> tuple[FlowVLA, list[float]]:
    """Flow matching on the demonstrations (:func:`~rollcap.rollout.learn.training.optimise`); returns the model and losses."""
    torch.manual_seed(cfg.seed)  # parameter init only; batches and flow noise use explicit generators
    state, tokens, chunks = torch.from_numpy(d.state), torch.from_numpy(d.tokens), torch.from_numpy(d.chunks)
    policy = FlowVLA(cfg.policy)
    policy.encoder.state_mean.copy_(state.mean(0))
    policy.encoder.state_std.copy_(state.std(0).clamp_min(1e-3))
    adv = torch.full((len(state),), ADV_POSITIVE, dtype=torch.int64)
    n = len(state)
    log(f"policy: {cfg.steps} steps of batch {cfg.batch} on {n} samples")
    losses = optimise(
        policy, lambda i, g: policy.loss([], state[i], tokens[i], adv[i], chunks[i], g),
        _batches(n, cfg.batch, cfg.steps, cfg.seed + 12), cfg.steps, cfg.lr, cfg.seed + 13, log,
    )  # fmt: skip
    return policy.eval(), losses


def train_mt10(cfg: MT10Config, out: Path, log=print) -> dict:
    """Collect, train, write ``out.{json,safetensors}`` and ``mt10_training_report.json`` beside it; returns the report."""
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    d = collect(cfg, log)
    t_collect = time.perf_counter() - t0
    log(
        f"collected {sum(v['episodes'] for v in d.per_task.values())} episodes, {len(d.state)} steps ({t_collect:.0f} s)"
    )
    policy, losses = train(d, cfg, log)
    t_total = time.perf_counter() - t0
    path = save_policy(policy, Path(out).with_suffix(""))
    k = max(1, len(losses) // 20)
    report = {
        "collect_seconds": round(t_collect, 1),
        "train_seconds": round(t_total - t_collect, 1),
        "total_seconds": round(t_total, 1),
        "samples": int(len(d.state)),
        "demos": d.per_task,
        "steps": cfg.steps,
        "loss_first_50": float(np.mean(losses[:50])),
        "loss_last_500": float(np.mean(losses[-500:])),
        "loss_curve": [round(float(np.mean(losses[i : i + k])), 5) for i in range(0, len(losses), k)],
        "parameters": sum(p.numel() for p in policy.parameters()),
        "threads": cfg.threads,
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "config": json.loads(json.dumps(asdict(cfg), default=list)),
    }
    (Path(path).parent / "mt10_training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    out = Path(__file__).resolve().parents[2] / "policies" / "weights" / "mt10_policy"
    cfg, a = parse_config(
        MT10Config, argv, "python3 -m rollcap.rollout.learn.mt10", __doc__.split("\n")[0],
        extra=[(("--out",), {"type": Path, "default": out})], skip=("policy",),
    )  # fmt: skip
    report = train_mt10(cfg, a.out, log=lambda m: print(m, flush=True))
    print(json.dumps({k: v for k, v in report.items() if k not in ("loss_curve", "config")}, indent=2))


if __name__ == "__main__":
    main()
