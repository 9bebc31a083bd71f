"""Train the MT10 critic on the shipped MT10 policy's own rollouts (state + instruction, no cameras).

One command, seeded end to end::

    OMP_NUM_THREADS=1 nice -n 5 python3 -m rollcap.rollout.learn.mt10_critic

1. **Rollouts.** The shipped MT10 policy (``policies/weights/mt10_policy.json``) runs ``--episodes`` episodes of each
   MT10 task through the host (no critic, its own noise, ``render_images=False``), run seed ``--run-seed`` (4141:
   never a training or held-out seed): the episodes ``rollcap run --seed 4141`` records. ``--runs DIR ...`` reads
   such recorded runs instead (their episodes digest-checked on reading).
2. **Targets** (:func:`~rollcap.rollout.learn.recap.value.value_targets`, the shipped critic's scale):
   ``-(T - t) / max_steps`` at step ``t`` of an episode that succeeded after ``T`` steps, ``-1`` in a failure
   (MetaWorld's 500-step truncation). Nothing is censored: no critic stopped these episodes.
3. **Training.** A :class:`~rollcap.critics.ValueCritic` from scratch (state normalised by the training steps'
   mean and std) on every step of four episodes in five; every fifth episode is held out
   (:data:`~rollcap.rollout.learn.recap.value.HOLDOUT_EVERY`) and the report measures the critic there:
   MAE, mid-episode AUROC (success vs failure), and what each stop threshold and patience would do to those
   episodes (:func:`~rollcap.rollout.offline.early_stop.early_stop_rows`: the host's stop predicate replayed on the
   values at each episode's chunk boundaries), with the setting :func:`suggest` picks there.

Writes ``critics/weights/mt10_critic.{json,safetensors}`` and ``mt10_critic_report.json`` beside them. The
figures on held-out seeds (run seed 31337) are measured through the host (BENCHMARKS.md, "MT10 critic").
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from rollcap.rollout.options import parse_config
from rollcap.critics import MT10_CHECKPOINT as MT10_CRITIC, ValueCritic, ValueCriticConfig, save_critic
from rollcap.envs.metaworld import ID_PREFIX, MT10, STATE_DIM
from rollcap.policies import MT10_CHECKPOINT as MT10_POLICY
from rollcap.rollout.learn.mt10 import HELD_OUT_SEED, POLICY
from rollcap.rollout.learn.recap.collect import Steps, StepsBuilder, read_runs
from rollcap.rollout.offline.early_stop import Boundaries, early_stop_rows
from rollcap.rollout.learn.recap.value import (
    HOLDOUT_EVERY,
    critic_quality,
    fit,
    holdout_mask,
    image_inputs,
    predict,
    value_targets,
)


CRITIC = ValueCriticConfig(
    image_keys=(),
    state_dim=STATE_DIM,
    state_group=3,
    max_tokens=POLICY.max_tokens,
    width=64,
    depth=2,
    heads=4,
    n_bins=41,
)
"""The MT10 critic: the MT10 policy's observation layout (39 numbers as 13 tokens of 3, 48 instruction tokens)."""

THRESHOLDS = (-0.8, -0.9, -0.95, -0.97, -0.99)
"""Stop thresholds the report's early-stop table replays on the held-out episodes, each at every :data:`PATIENCES`."""
PATIENCES = (2, 4, 6, 8)
"""``critic_patience`` values of the early-stop table (2: the host's default)."""
MAX_LOST = 0.005
"""The report's suggested stop setting loses at most this fraction of the held-out successes (:func:`suggest`)."""


def suggest(rows: list) -> dict | None:
    """Of the early-stop rows (held-out episodes of the training rollouts, never the evaluation seeds), the one that
    saves the most env steps while stopping at most :data:`MAX_LOST` of the successes (ties: the earlier row)."""
    ok = [r for r in rows if r.stopped_would_succeed <= MAX_LOST * r.successes]
    return max(ok, key=lambda r: (r.steps_saved, -rows.index(r))).to_json() if ok else None


@dataclass(frozen=True)
class CriticTrainConfig:
    """Knobs of :func:`train_mt10_critic`."""

    seed: int = 0
    """Initialisation and batches derive from it."""
    run_seed: int = 4141
    """Run seed of the rollouts (``rollcap run --seed``); never the held-out 31337."""
    episodes: int = 200
    """Rollouts per task."""
    steps: int = 4000
    """Optimiser steps."""
    batch: int = 64
    lr: float = 1e-3
    """AdamW learning rate (one-cycle)."""
    threads: int = 1
    """Intra-op threads for rollouts and training."""
    tasks: tuple[str, ...] = MT10

    def __post_init__(self):
        if self.run_seed == HELD_OUT_SEED:
            raise ValueError(f"--run-seed: {HELD_OUT_SEED} is the held-out evaluation's run seed")
        for name in ("episodes", "steps", "batch", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected an int >= 1, got {v!r}")
        if self.steps < 40:
            raise ValueError(
                f"--steps: expected an int >= 40 (the one-cycle warm-up is 5% of them), got {self.steps!r}"
            )
        if not self.tasks or any(t not in MT10 for t in self.tasks):
            raise ValueError(f"--tasks: expected MT10 tasks ({', '.join(MT10)}), got {list(self.tasks)}")
        if not self.lr > 0:
            raise ValueError(f"--lr: expected > 0, got {self.lr}")


def rollouts(cfg: CriticTrainConfig, policy: Path = MT10_POLICY, log=print) -> Steps:
    """Run ``policy`` for ``cfg.episodes`` episodes of each task through the host (no critic, synchronous, the
    checkpoint's ``execute_steps``): the episodes ``rollcap run --seed RUN_SEED`` records, kept in memory."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    acc = StepsBuilder(POLICY.horizon, None, CRITIC.max_tokens, CRITIC.obs_spec)
    for task in cfg.tasks:
        t0 = time.perf_counter()
        parts = Parts(
            env_id=ID_PREFIX + task,
            env_kwargs={"render_images": False},
            policy=policy,
            critic="none",
            threads=cfg.threads,
        )
        env = make_env(parts.env_id, parts.env_kwargs)
        runner, _ = make_runners(parts, env)
        host = RolloutHost(env, runner, None, HostConfig(seed=cfg.run_seed))
        try:
            for i in range(cfg.episodes):
                acc.add(host.run_episode(i).record, f"{parts.env_id} (run seed {cfg.run_seed})")
        finally:
            host.close()
        log(f"{task}: {cfg.episodes} rollouts ({time.perf_counter() - t0:.0f} s)")
    return acc.steps()


def read_rollouts(runs: list[Path]) -> Steps:
    """Every step of recorded runs of the MT10 policy (``rollcap run ... --critic none``), state only."""
    steps, _ = read_runs(runs, POLICY.horizon, None, CRITIC.max_tokens, CRITIC.obs_spec)
    return steps


def check_complete(steps: Steps) -> Steps:
    """Refuse an episode that did not run to its natural end (its outcome, the target, is unknown)."""
    cut = [r for r in steps.episodes if r["censored"]]
    if cut:
        raise ValueError(
            f"{cut[0]['source']}: episode {cut[0]['index']} stopped early ({cut[0]['stop_reason']}); the critic learns from episodes run to their end"
        )
    return steps


def held_out_boundaries(critic: ValueCritic, steps: Steps, execute_steps: int) -> list[Boundaries]:
    """The held-out episodes as the stop predicate sees them: the critic's value at each chunk boundary (steps
    ``0, s, 2s, ...``, the synchronous schedule), their outcomes and lengths."""
    held = holdout_mask_rows(steps)
    at = (steps.t % execute_steps == 0) & held[steps.episode]
    v = predict(critic, steps.images[at], steps.state[at], steps.tokens[at])
    rows, ts = steps.episode[at], steps.t[at]
    out = []
    for e in np.flatnonzero(held):
        r = steps.episodes[e]
        out.append(Boundaries(v[rows == e], ts[rows == e], bool(r["success"]), int(r["steps"])))
    return out


def train_critic(steps: Steps, cfg: CriticTrainConfig, log=print) -> tuple[ValueCritic, np.ndarray, list[float]]:
    """A fresh :data:`CRITIC` fitted on the steps of the episodes not held out; returns it, the targets and the losses."""
    targets = value_targets(steps, np.zeros(len(steps.episodes), np.float32))
    train = ~holdout_mask(steps)
    torch.manual_seed(cfg.seed)  # parameter init only; batches use explicit generators
    critic = ValueCritic(CRITIC)
    state = torch.from_numpy(steps.state[train])
    critic.encoder.state_mean.copy_(state.mean(0))
    critic.encoder.state_std.copy_(state.std(0).clamp_min(1e-3))
    data = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in (("images", steps.images[train]), ("state", steps.state[train]),
                                                                       ("tokens", steps.tokens[train]), ("value", targets[train]))}  # fmt: skip
    log(
        f"critic: {cfg.steps} steps of batch {cfg.batch} on {int(train.sum())} steps of {int((~holdout_mask_rows(steps)).sum())} episodes"
    )

    def loss(parts, gen):
        i = torch.from_numpy(parts[0])
        return critic.loss(image_inputs(data["images"][i]), data["state"][i], data["tokens"][i], data["value"][i])

    losses = fit(critic, loss, (int(train.sum()),), cfg.steps, cfg.batch, cfg.lr, cfg.seed + 31, log)
    return critic.eval(), targets, losses


def holdout_mask_rows(steps: Steps) -> np.ndarray:
    """``[E]`` True for the episodes held out of training."""
    return np.arange(len(steps.episodes)) % HOLDOUT_EVERY == 0


def train_mt10_critic(
    cfg: CriticTrainConfig, runs: list[Path] | None = None, out: Path = MT10_CRITIC, log=print
) -> dict:
    """Run (or, with ``runs``, read recorded) rollouts, train, write ``out.{json,safetensors}`` and
    ``mt10_critic_report.json``; returns the report."""
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    steps = check_complete(read_rollouts(runs) if runs else rollouts(cfg, log=log))
    t_data = time.perf_counter() - t0
    wins = sum(r["success"] for r in steps.episodes)
    log(f"rollouts: {len(steps.episodes)} episodes ({wins} successes), {len(steps)} steps ({t_data:.0f} s)")
    critic, targets, losses = train_critic(steps, cfg, log)
    t_train = time.perf_counter() - t0 - t_data
    path = save_critic(critic, Path(out).with_suffix(""))
    hold = holdout_mask(steps)
    values = np.zeros(len(steps), np.float32)
    values[hold] = predict(critic, steps.images[hold], steps.state[hold], steps.tokens[hold])
    held = held_out_boundaries(critic, steps, POLICY.execute_steps)
    stops = [row for patience in PATIENCES for row in early_stop_rows(held, THRESHOLDS, patience)]
    per_task = {}
    for task in sorted({r["task"] for r in steps.episodes}):
        sel = hold & (np.array([r["task"] for r in steps.episodes])[steps.episode] == task)
        per_task[task] = critic_quality(values, targets, steps, sel)
    k = max(1, len(losses) // 20)
    report = {
        "rollouts": {"runs": [str(r) for r in runs] if runs else None, "run_seed": cfg.run_seed, "episodes": len(steps.episodes), "successes": wins, "steps": len(steps),
                     "per_task": {t: {"episodes": sum(r["task"] == t for r in steps.episodes), "successes": sum(r["success"] for r in steps.episodes if r["task"] == t)}
                                  for t in sorted({r["task"] for r in steps.episodes})}},
        "held_out": {"every": HOLDOUT_EVERY, **critic_quality(values, targets, steps, hold), "per_task": per_task},
        "early_stop_held_out": [row.to_json() for row in stops],
        "suggested_stop": suggest(stops),
        "data_seconds": round(t_data, 1), "train_seconds": round(t_train, 1),
        "loss_first_50": float(np.mean(losses[:50])), "loss_last_500": float(np.mean(losses[-500:])),
        "loss_curve": [round(float(np.mean(losses[i : i + k])), 5) for i in range(0, len(losses), k)],
        "parameters": sum(p.numel() for p in critic.parameters()), "threads": cfg.threads, "load_average": os.getloadavg(),
        "torch": torch.__version__, "config": json.loads(json.dumps(asdict(cfg), default=list)),
    }  # fmt: skip
    (Path(path).parent / "mt10_critic_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    runs = {
        "type": Path,
        "nargs": "+",
        "default": None,
        "help": "read these recorded runs of the MT10 policy instead of running the rollouts "
        "(rollcap run --env rollcap/MetaWorld-<task> --env-kwargs '{\"render_images\": false}' --policy policies/weights/mt10_policy.json --critic none --seed 4141 --episodes 200)",
    }
    cfg, a = parse_config(
        CriticTrainConfig, argv, "python3 -m rollcap.rollout.learn.mt10_critic", __doc__.split("\n")[0],
        extra=[(("--runs",), runs), (("--out",), {"type": Path, "default": MT10_CRITIC})],
    )  # fmt: skip
    report = train_mt10_critic(cfg, a.runs, a.out, log=lambda m: print(m, flush=True))
    print(json.dumps({k: v for k, v in report.items() if k not in ("loss_curve", "config")}, indent=2))


if __name__ == "__main__":
    main()
