"""Fine-tune the shipped policy for real-time chunking's hard-prefix variant (issue 15).

``python3 -m rollcap.rollout.learn.train_prefix`` writes
``policies/weights/pushblock_policy_prefix.{json,safetensors}`` and
``prefix_training_report.json`` beside them; the shipped default checkpoint is
left as it is.

Training-time action conditioning (the trained alternative to the RTC paper's
guided inpainting): for every example a delay ``d`` is drawn from ``0 ..
max_delay``; the noisy chunk's first ``d`` actions are replaced by the clean
ground-truth actions and their per-token flow time is set to 0 ("clean"), and
the flow-matching loss is taken over the other tokens only. At inference
:meth:`~rollcap.policies.flow_vla.FlowVLA.inpaint_sample` writes the carried
prefix into those tokens at every Euler step: no guidance term, so it costs
what the plain sampler costs and is captured like it.

It starts from the shipped weights (not from scratch) and uses the demonstrations
:mod:`rollcap.rollout.learn.training` trained them on, regenerated from the same seed.
Which prefix the labels carry matters most (``--labels``; BENCHMARKS.md):
``stale`` (the default, the shipped file) relabels them with the stale plan
real-time chunking executes; ``expert`` is the published recipe.
Deterministic given the seeds and the thread count (one thread by default: the
machine is shared).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rollcap.rollout.options import parse_config
from rollcap.policies import DEFAULT_CHECKPOINT, FlowVLA, load_policy, save_policy
from rollcap.policies.flow_vla import ADV_DROPPED
from rollcap.rollout.learn.training import Demos, StalePrefix, TrainConfig, _train, collect_demos

PREFIX_CHECKPOINT = DEFAULT_CHECKPOINT.parent / "pushblock_policy_prefix.json"
"""The shipped prefix-conditioned checkpoint (select it with ``--policy``)."""


@dataclass(frozen=True)
class PrefixTrainConfig:
    """Knobs of :func:`finetune_prefix`."""

    seed: int = 0
    """The demonstrations' run seed (0: the shipped policy's own demos); batches derive from it too."""
    demos: int = 2000
    """Expert episodes (2000: all the shipped policy was trained on)."""
    steps: int = 3000
    """Optimiser steps."""
    batch: int = 64
    lr: float = 3e-4
    """Peak AdamW learning rate (one-cycle, as in training.py), lower than training from scratch."""
    max_delay: int = 4
    """Largest prefix length d drawn (uniform in 0..max_delay); real-time chunking needs d <= execute_steps."""
    threads: int = 1
    """Intra-op threads (the result depends on it at the last bit)."""
    labels: str = "stale"
    """``expert``: the prefix is the label chunk's own first d actions (training-time conditioning as published);
    ``stale``: the prefix is what real-time chunking executes, the plan made ``execute_steps`` steps earlier
    (plus ``prefix_noise``), and the rest of the label is the clean expert continuing from where it leaves the world
    (:func:`collect_prefix_demos`)."""
    prefix_noise: float = 0.1
    """``stale`` labels: Gaussian noise added to the stale prefix (the policy's own plans are worse than the expert's)."""

    def __post_init__(self):
        for name in ("demos", "steps", "batch", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(self, name)}")
        if self.max_delay < 0:
            raise ValueError(f"--max-delay: expected >= 0, got {self.max_delay}")
        if self.labels not in ("expert", "stale"):
            raise ValueError(f"--labels: expected expert or stale, got {self.labels!r}")


def prefix_loss(
    model: FlowVLA,
    images,
    state,
    tokens,
    adv,
    actions,
    max_delay: int,
    generator: torch.Generator | None = None,
    delays=None,
) -> torch.Tensor:
    """Flow-matching loss with a clean ground-truth prefix of random length per example, masked on the prefix.

    ``delays`` ``[B]``: the prefix lengths (default: drawn uniformly from ``0 .. max_delay``).

    Advantage dropout as in :meth:`FlowVLA.loss`. Needs ``model.cfg.prefix_conditioning`` (per-token time). The
    observation encoder runs without gradients (frozen: fine-tuning teaches the action expert the prefix; a step
    took 0.35 s instead of 0.58 s with the encoder trained too, on the busy 2-core machine).
    """
    if not model.cfg.prefix_conditioning:
        raise ValueError("prefix_loss needs a model with prefix_conditioning")
    b, h, _ = actions.shape
    dev = actions.device
    drop = torch.rand(b, generator=generator, device=dev) < model.cfg.adv_dropout
    adv = torch.where(drop, torch.full_like(adv, ADV_DROPPED), adv)
    d = torch.randint(0, max_delay + 1, (b,), generator=generator, device=dev)
    d = d if delays is None else delays.to(dev)
    prefix = torch.arange(h, device=dev)[None, :] < d[:, None]  # [B, H]
    t = torch.rand(b, generator=generator, device=dev) * 0.999 + 0.001
    t_tok = torch.where(prefix, torch.zeros((), device=dev), t[:, None])
    noise = torch.randn(actions.shape, generator=generator, device=dev)
    x_t = t_tok[..., None] * noise + (1.0 - t_tok[..., None]) * actions  # the prefix is the clean action
    with torch.no_grad():  # the observation encoder is frozen: only the action expert learns the prefix
        hidden, valid, split = model.prefix_hidden(images, state, tokens, adv)
    v = model.expert(x_t, t_tok, model.expert.prefix_kv(hidden, **split), valid)
    err = F.mse_loss(v, noise - actions, reduction="none").mean(-1)  # [B, H]
    free = (~prefix).to(err.dtype)
    return (err * free).sum() / free.sum().clamp_min(1.0)


def collect_prefix_demos(tc: TrainConfig, max_delay: int, prefix_noise: float, seed: int) -> tuple[Demos, np.ndarray]:
    """The episodes :func:`~rollcap.rollout.learn.training.collect_demos` runs (same seeds, same executed actions), labelled
    for real-time chunking (:class:`~rollcap.rollout.learn.training.StalePrefix`); returns them and each step's prefix length ``d``."""
    demos = collect_demos(tc, StalePrefix(max_delay, prefix_noise, seed))
    return demos, demos.delay


def prefix_model(base: FlowVLA) -> FlowVLA:
    """A prefix-conditioned copy of ``base`` (same weights: the flag adds no parameters); its encoder frozen."""
    model = FlowVLA(dataclasses.replace(base.cfg, prefix_conditioning=True))
    model.load_state_dict(base.state_dict())
    for p in (*model.encoder.parameters(), *model.adv_emb.parameters()):
        p.requires_grad_(False)  # the optimiser skips them (no grad): the observation side stays the shipped one
    return model


def finetune_prefix(
    cfg: PrefixTrainConfig, out: Path = PREFIX_CHECKPOINT, base_path: Path = DEFAULT_CHECKPOINT, log=print
) -> dict:
    """Regenerate the demos, fine-tune ``base_path`` with :func:`prefix_loss`, write ``out`` and its report."""
    torch.set_num_threads(cfg.threads)
    base = load_policy(base_path)
    if cfg.max_delay > base.cfg.horizon - 1:
        raise ValueError(
            f"--max-delay: expected <= {base.cfg.horizon - 1} (the chunk has {base.cfg.horizon} actions), got {cfg.max_delay}"
        )
    tc = TrainConfig(
        seed=cfg.seed,
        demos=cfg.demos,
        policy_steps=cfg.steps,
        batch=cfg.batch,
        lr=cfg.lr,
        threads=cfg.threads,
        policy=dataclasses.replace(base.cfg),
    )
    t0 = time.perf_counter()
    if cfg.labels == "stale":
        d, delays = collect_prefix_demos(tc, cfg.max_delay, cfg.prefix_noise, cfg.seed + 22)
        delays = torch.from_numpy(delays)
    else:
        d, delays = collect_demos(tc), None
    t_demos = time.perf_counter() - t0
    log(f"collected {cfg.demos} demos, {len(d.value)} steps ({t_demos:.0f} s)")
    model = prefix_model(base)
    images, state, tokens = torch.from_numpy(d.images), torch.from_numpy(d.state), torch.from_numpy(d.tokens)
    chunks, adv = torch.from_numpy(d.chunks), torch.from_numpy(d.adv)
    n = len(d.value)
    del d
    log(f"fine-tune: {cfg.steps} steps on {n} samples, d in 0..{cfg.max_delay}")
    t1 = time.perf_counter()
    losses = _train(model, lambda i, g: prefix_loss(model, [images[i]], state[i], tokens[i], adv[i], chunks[i], cfg.max_delay, g, None if delays is None else delays[i]),
                    cfg.steps, tc, n, cfg.seed + 21, log)  # fmt: skip
    model.eval()
    save_policy(model, Path(out).with_suffix(""))
    report = {
        "base": Path(base_path).name, "base_weights_digest": json.loads(Path(base_path).with_suffix(".json").read_text())["weights_digest"],
        "demo_seconds": t_demos, "train_seconds": time.perf_counter() - t1, "samples": n,
        "loss_first_100": float(np.mean(losses[:100])), "loss_last_100": float(np.mean(losses[-100:])),
        "config": dataclasses.asdict(cfg),
    }  # fmt: skip
    (Path(out).parent / "prefix_training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    out = {"type": Path, "default": PREFIX_CHECKPOINT, "help": "checkpoint path to write (.json)"}
    base = {"type": Path, "default": DEFAULT_CHECKPOINT, "help": "checkpoint to start from"}
    cfg, a = parse_config(
        PrefixTrainConfig, argv, "python3 -m rollcap.rollout.learn.train_prefix", __doc__.split("\n")[0],
        extra=[(("--out",), out), (("--base",), base)],
    )  # fmt: skip
    out, base = a.out, a.base
    finetune_prefix(cfg, out, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
