"""Fine-tune the MT10 policy for real-time chunking's hard-prefix variant, on the MT10 DART demonstrations.

One command, seeded end to end::

    OMP_NUM_THREADS=1 nice -n 5 python3 -m rollcap.rollout.learn.mt10_prefix

writes ``policies/weights/mt10_policy_prefix.{json,safetensors}`` and ``mt10_prefix_report.json`` beside them.

With real-time chunking at delay ``d`` a chunk inferred from the observation at step ``t`` starts with ``d``
actions it does not choose: the previous plan's, executed while it was inferred. The labels here give that
situation exactly, from the demonstrations the MT10 policy was trained on (:func:`~rollcap.rollout.learn.mt10.collect`,
regenerated from the same seed): the expert executes with Gaussian noise, so at a visited step ``t`` the prefix is
the ``d`` *noisy* actions that were executed at ``t .. t+d-1`` (a plan that is not the clean expert's, as a stale
plan is not), and the rest of the label is the clean expert's action at each step the world reached after them.
No simulation is needed: the noisy path is the prefix's own consequence.

Training is :func:`~rollcap.rollout.learn.train_prefix.prefix_loss` (the prefix as clean tokens at flow time 0, the
loss on the other tokens, the observation encoder frozen) from the shipped MT10 weights, ``d`` drawn per sample
from ``0 .. max_delay`` (``d = 0``: the plain policy's labels, so it keeps its synchronous behaviour). At inference
an RTC host samples it with :meth:`~rollcap.policies.flow_vla.FlowVLA.inpaint_sample` (``--chunking rtc``; the
runner picks hard inpainting from the checkpoint's ``prefix_conditioning``).
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
from rollcap.policies import ADV_POSITIVE, MT10_CHECKPOINT, load_policy, save_policy
from rollcap.rollout.learn.mt10 import MT10Config, collect
from rollcap.rollout.learn.train_prefix import prefix_loss, prefix_model
from rollcap.rollout.learn.training import _batches, optimise

BASE = MT10_CHECKPOINT
PREFIX = MT10_CHECKPOINT.parent / "mt10_policy_prefix.json"
"""The shipped hard-prefix MT10 checkpoint (select it with ``--policy``; an RTC host then pins the prefix)."""


@dataclass(frozen=True)
class MT10PrefixConfig:
    """Knobs of :func:`train_mt10_prefix`."""

    seed: int = 0
    """Seed of the demonstrations (0: the shipped MT10 policy's own) and of the batches and delays."""
    demos_per_task: int = 150
    steps: int = 4000
    """Optimiser steps."""
    batch: int = 64
    lr: float = 3e-4
    """Peak AdamW learning rate (one-cycle), lower than training from scratch."""
    max_delay: int = 3
    """Largest prefix length d drawn (uniform in 0..max_delay); the MT10 policy executes 4 actions per chunk."""
    threads: int = 1

    def __post_init__(self):
        for name in ("demos_per_task", "batch", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected an int >= 1, got {getattr(self, name)!r}")
        if not isinstance(self.steps, int) or self.steps < 40:
            raise ValueError(
                f"--steps: expected an int >= 40 (the one-cycle warm-up is 5% of them), got {self.steps!r}"
            )
        if not isinstance(self.max_delay, int) or not 1 <= self.max_delay <= 7:
            raise ValueError(
                f"--max-delay: expected an int in 1..7 (the chunk holds 8 actions), got {self.max_delay!r}"
            )
        if not self.lr > 0:
            raise ValueError(f"--lr: expected > 0, got {self.lr}")


def prefix_labels(chunks: np.ndarray, executed: np.ndarray, max_delay: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per sample a delay ``d`` (uniform in ``0 .. max_delay``, from ``seed``) and its label: the executed actions
    ``t .. t+d-1``, then the clean chunk's from ``d`` on. Returns ``(labels [N, H, A], delays [N])``."""
    rng = np.random.default_rng(seed)
    delays = rng.integers(0, max_delay + 1, len(chunks))
    pinned = np.arange(chunks.shape[1])[None, :, None] < delays[:, None, None]
    return np.where(pinned, executed, chunks).astype(np.float32), delays.astype(np.int64)


def train_mt10_prefix(cfg: MT10PrefixConfig, out: Path = PREFIX, base_path: Path = BASE, log=print) -> dict:
    """Regenerate the demonstrations, fine-tune ``base_path`` with prefix labels, write ``out`` and its report."""
    torch.set_num_threads(cfg.threads)
    base = load_policy(base_path)
    t0 = time.perf_counter()
    d = collect(MT10Config(seed=cfg.seed, demos_per_task=cfg.demos_per_task, policy=base.cfg), log)
    t_demos = time.perf_counter() - t0
    labels, delays = prefix_labels(d.chunks, d.executed, cfg.max_delay, cfg.seed + 41)
    state, tokens = torch.from_numpy(d.state), torch.from_numpy(d.tokens)
    chunks, delays_t = torch.from_numpy(labels), torch.from_numpy(delays)
    adv = torch.full((len(state),), ADV_POSITIVE, dtype=torch.int64)
    model = prefix_model(base)
    n = len(state)
    log(f"fine-tune: {cfg.steps} steps of batch {cfg.batch} on {n} samples, d in 0..{cfg.max_delay}")
    t1 = time.perf_counter()
    losses = optimise(model, lambda i, g: prefix_loss(model, [], state[i], tokens[i], adv[i], chunks[i], cfg.max_delay, g, delays_t[i]),
                      _batches(n, cfg.batch, cfg.steps, cfg.seed + 42), cfg.steps, cfg.lr, cfg.seed + 43, log)  # fmt: skip
    model.eval()
    path = save_policy(model, Path(out).with_suffix(""))
    report = {
        "base": Path(base_path).name, "base_weights_digest": json.loads(Path(base_path).with_suffix(".json").read_text())["weights_digest"],
        "demo_seconds": round(t_demos, 1), "train_seconds": round(time.perf_counter() - t1, 1), "samples": n,
        "delays": np.bincount(delays, minlength=cfg.max_delay + 1).tolist(),
        "loss_first_100": float(np.mean(losses[:100])), "loss_last_500": float(np.mean(losses[-500:])),
        "threads": cfg.threads, "load_average": os.getloadavg(), "torch": torch.__version__, "config": asdict(cfg),
    }  # fmt: skip
    (Path(path).parent / "mt10_prefix_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    base = {"type": Path, "default": BASE, "help": "the checkpoint to fine-tune (default: the shipped MT10 policy)"}
    cfg, a = parse_config(
        MT10PrefixConfig, argv, "python3 -m rollcap.rollout.learn.mt10_prefix", __doc__.split("\n")[0],
        extra=[(("--base",), base), (("--out",), {"type": Path, "default": PREFIX})],
    )  # fmt: skip
    out, base = a.out, a.base
    report = train_mt10_prefix(cfg, out, base, log=lambda m: print(m, flush=True))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
