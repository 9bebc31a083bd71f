"""Train the default PushBlock policy and critic from scripted demonstrations.

Pipeline (seeded end to end, no global RNG): collect expert episodes at mixed
noise levels (so some fail) -> RECAP-style labels (value = -steps_to_success /
max_steps, -1 for failures; advantage indicator positive for successful
episodes) -> train the critic (two-hot distributional loss) and the
advantage-conditioned FlowVLA (flow matching with indicator dropout) ->
evaluate through the real :class:`RolloutHost` -> write safetensors weights.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from rollcap.critics import ValueCritic, ValueCriticConfig, save_critic
from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.envs.push_block import PushBlockEnv
from rollcap.policies import ADV_NEGATIVE, ADV_POSITIVE, FlowVLA, FlowVLAConfig, save_policy, tokenize
from rollcap.rollout.build import critic_runner, policy_runner
from rollcap.rollout.seeding import episode_seed


@dataclass(frozen=True)
class TrainConfig:
    """Knobs of :func:`train_default`."""

    seed: int = 0
    """Run seed: demonstrations, initialisation, batches and evaluation derive from it."""
    demos: int = 2000
    """Expert episodes to collect."""
    noisy_fraction: float = 0.2
    """Fraction of episodes from the mistake-making expert (most failures come from here)."""
    policy_steps: int = 6000
    """Optimiser steps for the policy."""
    critic_steps: int = 1500
    """Optimiser steps for the critic."""
    batch: int = 64
    """Batch size for both models."""
    lr: float = 1e-3
    """AdamW learning rate (cosine decay)."""
    eval_episodes: int = 50
    """Episodes per evaluation (trained policy, expert, random)."""
    threads: int = 2
    """Intra-op threads for training."""
    policy: FlowVLAConfig = FlowVLAConfig()
    critic: ValueCriticConfig = ValueCriticConfig()

    def __post_init__(self):
        for name in ("demos", "policy_steps", "critic_steps", "batch", "eval_episodes", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(self, name)}")


NOISY = ExpertNoise(action_std=0.2, wrong_block_prob=0.5, give_up_prob=0.5)
"""Mistake episodes: their own (often failing) actions are the labels, advantage by outcome."""
EXPLORE_STD = 0.3
"""DART episodes execute the expert's action plus this much Gaussian noise ..."""
CLEAN = ExpertNoise()
"""... and label every visited state with the clean expert's next chunk, simulated ahead."""


@dataclass
class Demos:
    """Flat per-step arrays over all demonstrations."""

    images: np.ndarray  # [N, S, S, 3] uint8
    state: np.ndarray  # [N, D] float32
    tokens: np.ndarray  # [N, T] int64
    chunks: np.ndarray  # [N, H, A] float32
    value: np.ndarray  # [N] float32
    adv: np.ndarray  # [N] int64
    episode_success: np.ndarray  # [E] bool
    delay: np.ndarray | None = None  # [N] int64: real-time-chunking prefix length (StalePrefix labels only)


def _expert_chunk(look: PushBlockEnv, state: dict, obs: dict, h: int, prefix: np.ndarray | None = None) -> np.ndarray:
    """``prefix`` executed from ``state``, then the clean expert's next actions to ``h`` in all, simulated on a copy
    of the world (zero after the episode ends)."""
    look.set_state(state)
    expert = ScriptedExpert(CLEAN)
    expert.reset(0)
    out = np.zeros((h, 2), np.float32)
    d = 0 if prefix is None else len(prefix)
    if d:
        out[:d] = prefix
    for j in range(h):
        if j >= d:
            out[j] = expert.act(obs)
        obs, _, term, trunc, _ = look.step(out[j])
        if term or trunc:
            break  # success (or time out): the rest of the chunk stays zero
    return out


@dataclass(frozen=True)
class StalePrefix:
    """Relabels exploration steps for real-time chunking (see :mod:`rollcap.rollout.learn.train_prefix`).

    At step ``t >= s`` (``s``: the policy's execution horizon) a prefix length
    ``d`` is drawn from ``0 .. max_delay``; the prefix is actions ``s .. s+d-1``
    of the clean chunk labelled at ``t - s`` (what RTC executes at
    ``t .. t+d-1``) plus ``noise``, and the label is that prefix executed on a
    copy of the world, then the clean expert's continuation. Steps before
    ``s`` get ``d = 0``; mistake episodes keep their own actions, with a drawn ``d``.
    """

    max_delay: int
    noise: float
    seed: int


def collect_demos(cfg: TrainConfig, stale: StalePrefix | None = None) -> Demos:
    """Run the expert; label every step with its chunk, value and advantage.

    Two kinds of episodes: DART-style exploration (noisy execution, clean
    expert chunks as labels, advantage positive) and mistake episodes (the
    noisy expert's own actions, advantage positive only if it succeeded).
    Values are ``-steps_to_success / max_steps`` of the executed episode, -1
    if it failed. With ``stale`` the same episodes (same seeds, same executed
    actions) are labelled for real-time chunking and ``Demos.delay`` holds each
    step's prefix length.
    """
    env = PushBlockEnv(image_size=cfg.policy.image_size)
    look = PushBlockEnv(render_images=False)
    max_steps = env.config.max_steps
    h, s = cfg.policy.horizon, cfg.policy.execute_steps
    rng_d = np.random.default_rng(stale.seed) if stale is not None else None
    cols: dict[str, list] = {k: [] for k in ("images", "state", "tokens", "chunks", "value", "adv", "delay")}
    successes = []
    for i in range(cfg.demos):
        seed = episode_seed(cfg.seed + 1, i)
        mistakes = (i % 10) < round(cfg.noisy_fraction * 10)
        expert = ScriptedExpert(NOISY if mistakes else CLEAN)
        expert.reset(seed)
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        images, states, labels, executed, delays, clean = [], [], [], [], [], []
        success = False
        for t in range(max_steps):
            a = expert.act(obs)
            if not mistakes:
                world = env.get_state()
                clean.append(_expert_chunk(look, world, obs, h))
                d = int(rng_d.integers(0, stale.max_delay + 1)) if stale is not None and t >= s else 0
                if d:
                    prefix = clean[t - s][s : s + d] + rng_d.normal(0.0, stale.noise, (d, 2)).astype(np.float32)
                    labels.append(_expert_chunk(look, world, obs, h, np.clip(prefix, -1.0, 1.0)))
                else:
                    labels.append(clean[t])
                delays.append(d)
                a = np.clip(a + rng.normal(0.0, EXPLORE_STD, 2), -1.0, 1.0).astype(np.float32)
            images.append(obs[cfg.policy.image_keys[0]])
            states.append(obs["state"])
            executed.append(a)
            obs, _, term, trunc, info = env.step(a)
            success = success or bool(info.get("is_success"))
            if term or trunc:
                break
        t_len = len(executed)
        if mistakes:
            acts = np.concatenate([np.asarray(executed, np.float32), np.zeros((h, 2), np.float32)])
            labels = [acts[t : t + h] for t in range(t_len)]
            delays = [int(rng_d.integers(0, stale.max_delay + 1)) if stale is not None else 0 for _ in range(t_len)]
        toks = tokenize(obs["instruction"], cfg.policy.max_tokens)
        for t in range(t_len):
            cols["images"].append(images[t])
            cols["state"].append(states[t])
            cols["tokens"].append(toks)
            cols["chunks"].append(labels[t])
            cols["value"].append(-(t_len - t) / max_steps if success else -1.0)
            cols["adv"].append(ADV_POSITIVE if (success or not mistakes) else ADV_NEGATIVE)
            cols["delay"].append(delays[t])
        successes.append(success)
    env.close()
    look.close()
    return Demos(
        images=np.stack(cols["images"]),
        state=np.stack(cols["state"]).astype(np.float32),
        tokens=np.stack(cols["tokens"]),
        chunks=np.stack(cols["chunks"]),
        value=np.asarray(cols["value"], np.float32),
        adv=np.asarray(cols["adv"], np.int64),
        episode_success=np.asarray(successes),
        delay=np.asarray(cols["delay"], np.int64) if stale is not None else None,
    )


def _batches(n: int, batch: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield torch.from_numpy(rng.integers(0, n, batch))


def _train(model, loss_fn, steps: int, cfg: TrainConfig, n: int, seed: int, log) -> list[float]:
    return optimise(model, loss_fn, _batches(n, cfg.batch, steps, seed), steps, cfg.lr, seed, log)


def optimise(model, loss_fn, batches, steps: int, lr: float, seed: int, log, reports: int = 10) -> list[float]:
    """AdamW (weight decay 1e-4) with a one-cycle schedule, gradients clipped at 1: ``loss_fn(batch, generator)``
    for each of the ``steps`` items of ``batches``; the generator is torch's, seeded with ``seed``. Returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for i, batch in enumerate(batches):
        loss = loss_fn(batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log and (i + 1) % max(1, steps // reports) == 0:
            log(f"  step {i + 1}/{steps} loss {np.mean(losses[-50:]):.4f}")
    return losses


def train_models(d: Demos, cfg: TrainConfig, log=print) -> tuple[FlowVLA, ValueCritic]:
    """Train both models on the demonstrations."""
    torch.manual_seed(cfg.seed)  # parameter init only; batches use explicit generators
    images, state, tokens = torch.from_numpy(d.images), torch.from_numpy(d.state), torch.from_numpy(d.tokens)
    mean, std = state.mean(0), state.std(0).clamp_min(1e-3)
    policy, critic = FlowVLA(cfg.policy), ValueCritic(cfg.critic)
    for m in (policy, critic):
        m.encoder.state_mean.copy_(mean)
        m.encoder.state_std.copy_(std)
    chunks, value, adv = torch.from_numpy(d.chunks), torch.from_numpy(d.value), torch.from_numpy(d.adv)
    n = len(d.value)
    log(f"critic: {cfg.critic_steps} steps on {n} samples")
    _train(
        critic,
        lambda i, g: critic.loss([images[i]], state[i], tokens[i], value[i]),
        cfg.critic_steps,
        cfg,
        n,
        cfg.seed + 11,
        log,
    )
    log(f"policy: {cfg.policy_steps} steps on {n} samples")
    _train(
        policy,
        lambda i, g: policy.loss([images[i]], state[i], tokens[i], adv[i], chunks[i], g),
        cfg.policy_steps,
        cfg,
        n,
        cfg.seed + 12,
        log,
    )
    return policy.eval(), critic.eval()


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability a random positive scores above a random negative (ties count half)."""
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (p.size * n.size))


def evaluate(policy: FlowVLA, critic: ValueCritic, cfg: TrainConfig, log=print) -> dict:
    """Success rates of trained policy / clean expert / random policy, and critic AUROC."""
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    seeds = [episode_seed(cfg.seed + 2, i) for i in range(cfg.eval_episodes)]
    env = PushBlockEnv(image_size=cfg.policy.image_size)
    host = RolloutHost(
        env, policy_runner(policy), critic_runner(critic), HostConfig(seed=cfg.seed + 2)
    )  # the policy's execute_steps
    records = [host.run_episode(i, s).record for i, s in enumerate(seeds)]

    def mid_value(rec) -> float:
        starts = rec.chunks["chunk_start"]
        k = int(np.searchsorted(starts, rec.num_steps // 2))
        return float(rec.chunks["critic_value"][min(k, len(starts) - 1)])

    # Critic separation on a mixed set: the policy's episodes and the noisy expert's.
    runner = critic_runner(critic)
    expert_mid, expert_ok = [], []
    for s in seeds:
        ex = ScriptedExpert(NOISY)
        ex.reset(s)
        obs, _ = env.reset(seed=s)
        traj, ok = [obs], False
        for _ in range(env.config.max_steps):
            obs, _, term, trunc, info = env.step(ex.act(obs))
            traj.append(obs)
            ok = ok or bool(info.get("is_success"))
            if term or trunc:
                break
        expert_mid.append(runner.value(traj[(len(traj) - 1) // 2]))
        expert_ok.append(ok)

    def success_rate(act) -> float:
        wins = 0
        for s in seeds:
            obs, _ = env.reset(seed=s)
            for _ in range(env.config.max_steps):
                obs, _, term, trunc, info = env.step(act(obs))
                if term or trunc:
                    wins += bool(info.get("is_success"))
                    break
        return wins / len(seeds)

    clean = ScriptedExpert(ExpertNoise())
    expert_rate = success_rate(lambda o: clean.act(o))
    rng = np.random.default_rng(cfg.seed + 3)
    random_rate = success_rate(lambda o: rng.uniform(-1, 1, 2).astype(np.float32))
    pol_mid = np.array([mid_value(r) for r in records])
    pol_ok = np.array([r.success for r in records])
    mids = np.concatenate([pol_mid, expert_mid])
    oks = np.concatenate([pol_ok, expert_ok])
    out = {
        "episodes": len(seeds),
        "policy_success": float(pol_ok.mean()),
        "expert_success": expert_rate,
        "random_success": random_rate,
        "noisy_expert_success": float(np.mean(expert_ok)),
        "critic_auroc_mid_episode": auroc(mids[oks], mids[~oks]),
        "critic_auroc_policy_only": auroc(pol_mid[pol_ok], pol_mid[~pol_ok]),
        "critic_auroc_noisy_expert_only": auroc(
            np.array(expert_mid)[np.array(expert_ok)], np.array(expert_mid)[~np.array(expert_ok)]
        ),
        "mixed_set": {"successes": int(oks.sum()), "failures": int((~oks).sum())},
    }
    log(json.dumps(out, indent=2))
    return out


def evaluate_checkpoints(cfg: TrainConfig, policy_path: Path, critic_path: Path, log=print) -> dict:
    """Re-run :func:`evaluate` on saved checkpoints and refresh ``training_report.json`` (keeps ``train_seconds``)."""
    from rollcap.critics import load_critic
    from rollcap.policies import load_policy

    torch.set_num_threads(cfg.threads)
    path = Path(policy_path).parent / "training_report.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    report = {"train_seconds": old.get("train_seconds")}
    report.update(evaluate(load_policy(policy_path), load_critic(critic_path), cfg, log))
    report["config"] = old.get("config") or json.loads(json.dumps(asdict(cfg), default=list))
    path.write_text(json.dumps(report, indent=2) + "\n")
    return report


def train_default(cfg: TrainConfig, policy_path: Path, critic_path: Path, log=print) -> dict:
    """Collect, train, evaluate; write the checkpoints and ``training_report.json`` beside the policy."""
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    d = collect_demos(cfg)
    log(
        f"collected {cfg.demos} demos, {len(d.value)} steps, {d.episode_success.mean():.0%} successful ({time.perf_counter() - t0:.0f} s)"
    )
    policy, critic = train_models(d, cfg, log)
    t_train = time.perf_counter() - t0
    save_policy(policy, Path(policy_path).with_suffix(""))
    save_critic(critic, Path(critic_path).with_suffix(""))
    report = {"train_seconds": t_train}
    report.update(evaluate(policy, critic, cfg, log))
    cfg_json = asdict(cfg)
    report["config"] = json.loads(json.dumps(cfg_json, default=list))
    (Path(policy_path).parent / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
