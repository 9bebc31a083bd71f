"""The learner's side of flow-policy RL: chunks to tensors, advantages, the clipped policy-gradient update.

A training sample is one Euler step of one chunk's denoising (:mod:`rollcap.policies.flow_sde`): the observation,
the recorded trace ``x_0 .. x_K``, the step's log-probability when it was sampled (``logp_old``) and the chunk's
advantage. The loss is PPO's clipped surrogate per step (as Flow-GRPO takes it: each denoising step is a step of
the policy), averaged over every step of every chunk::

    ratio = exp(logp_new - logp_old);   loss = -mean(min(ratio A, clip(ratio, 1 - eps, 1 + eps) A))

Advantages (:func:`group_advantages`, :func:`gae`): GRPO's group-relative outcome (every chunk of an episode gets
``(R - mean_group) / (std_group + eps)``; no critic), or PPO's GAE over chunks with a value head
(:class:`ValueHead`, a small MLP on the env's state vector) trained on the returns.

``train="expert"`` updates the action expert alone (the prefix encoder's keys/values are computed once per batch,
without gradients: about half the learner's work); ``"all"`` updates every weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rollcap.policies.flow_sde import prefix, step_logp


@dataclass
class Batch:
    """Chunks as the learner reads them (numpy, row per chunk)."""

    images: dict[str, np.ndarray]
    state: np.ndarray
    tokens: np.ndarray
    trace: np.ndarray
    """``[N, K+1, H, A]`` float32."""
    logp: np.ndarray
    """``[N, K]`` float32: each step's log-probability when sampled."""
    adv: np.ndarray
    """``[N]`` float32."""

    def __len__(self) -> int:
        return int(self.trace.shape[0])

    def rows(self, idx: np.ndarray) -> Batch:
        return Batch({k: v[idx] for k, v in self.images.items()}, self.state[idx], self.tokens[idx], self.trace[idx],
                     self.logp[idx], self.adv[idx])  # fmt: skip


def group_advantages(returns: np.ndarray, groups: np.ndarray, normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """GRPO's advantage of each episode: its return less its group's mean (over the std too, with ``normalize``)."""
    adv = np.zeros(len(returns), np.float64)
    for g in np.unique(groups):
        m = groups == g
        r = returns[m].astype(np.float64)
        a = r - r.mean()
        if normalize:
            a = a / (r.std() + eps)
        adv[m] = a
    return adv.astype(np.float32)


def gae(
    rewards: np.ndarray, values: np.ndarray, last: float, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns of one episode's chunks (``last``: the value after the last chunk,
    0 at a terminal end)."""
    adv = np.zeros(len(rewards), np.float32)
    g = 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t + 1 < len(values) else last
        delta = rewards[t] + gamma * nxt - values[t]
        g = delta + gamma * lam * g
        adv[t] = g
    return adv, adv + values.astype(np.float32)


class ValueHead(nn.Module):
    """PPO's critic: a LayerNorm MLP from the env's state vector (and a task code) to the chunk's value."""

    def __init__(self, dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.LayerNorm(hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.LayerNorm(hidden),
            nn.SiLU(), nn.Linear(hidden, 1),
        )  # fmt: skip
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0]


class FlowLearner:
    """The trainable policy and its optimiser; :meth:`update` is one PPO/GRPO update over a batch of chunks.

    Args:
        model: the FlowVLA to train (this learner owns it: put a copy in the rollout's runner).
        noise_level: the SDE's ``a`` (the rollout's).
        lr, clip, epochs, minibatch, max_grad_norm: the update's settings.
        train: ``expert`` or ``all`` (see the module docstring).
        seed: the minibatch shuffles' stream (one per update, derived from it and the update's number).
    """

    def __init__(self, model, noise_level: float, lr: float, clip: float, epochs: int, minibatch: int,
                 max_grad_norm: float, train: str = "expert", seed: int = 0):  # fmt: skip
        self.model, self.noise_level = model, float(noise_level)
        self.clip, self.epochs, self.minibatch, self.max_grad_norm = clip, epochs, minibatch, max_grad_norm
        self.train, self.seed = train, int(seed)
        model.train(False)  # no dropout in the FlowVLA; eval mode keeps it deterministic
        for p in model.parameters():
            p.requires_grad_(False)
        self.params = list(model.expert.parameters()) if train == "expert" else list(model.parameters())
        for p in self.params:
            p.requires_grad_(True)
        self.opt = torch.optim.Adam(self.params, lr=lr)
        self.updates = 0

    def _inputs(self, b: Batch):
        images = [torch.from_numpy(b.images[k]) for k in self.model.cfg.image_keys]
        return images, torch.from_numpy(b.state), torch.from_numpy(b.tokens)

    def logp(self, b: Batch, grad: bool = False, kv=None) -> torch.Tensor:
        """Each step's log-probability ``[N, K]`` of ``b``'s traces under the current weights (``kv``: the frozen
        prefix's keys/values for ``b``, :meth:`frozen_prefix`)."""
        images, state, tokens = self._inputs(b)
        with torch.set_grad_enabled(grad):
            if kv is None and self.train == "expert":
                kv = self.frozen_prefix(b)
            return step_logp(self.model, images, state, tokens, torch.from_numpy(b.trace), self.noise_level, kv)

    @torch.no_grad()
    def frozen_prefix(self, b: Batch, rows: int = 256):
        """The prefix's keys/values and key mask for ``b`` (``train="expert"``: they do not change within an update, so
        an update computes them once for all its epochs), in blocks of ``rows``."""
        parts = []
        for lo in range(0, len(b), rows):
            images, state, tokens = self._inputs(b.rows(np.arange(lo, min(lo + rows, len(b)))))
            parts.append(prefix(self.model, images, state, tokens, len(state)))
        kv = [tuple(torch.cat([p[0][i][j] for p in parts]) for j in (0, 1)) for i in range(len(parts[0][0]))]
        return kv, torch.cat([p[1] for p in parts])

    def update(self, batch: Batch) -> dict:
        """``epochs`` passes over ``batch`` in shuffled minibatches; returns the update's statistics."""
        rng = np.random.default_rng([self.seed, 0xF10E, self.updates])
        stats = {"loss": [], "clip_fraction": [], "approx_kl": [], "ratio_dev": [], "grad_norm": []}
        n = len(batch)
        # the frozen prefix once for every epoch (rows are chunks: with guidance the rows are two blocks, computed per minibatch)
        frozen = self.frozen_prefix(batch) if self.train == "expert" and self.model.cfg.cfg_beta == 1.0 else None
        for _ in range(self.epochs):
            order = rng.permutation(n)
            for lo in range(0, n, self.minibatch):
                idx = order[lo : lo + self.minibatch]
                mb = batch.rows(idx)
                kv = None
                if frozen is not None:
                    t = torch.from_numpy(idx)
                    kv = ([(k[t], v[t]) for k, v in frozen[0]], frozen[1][t])
                new = self.logp(mb, grad=True, kv=kv)
                old = torch.from_numpy(mb.logp)
                adv = torch.from_numpy(mb.adv)[:, None]
                log_ratio = new - old
                ratio = log_ratio.exp()
                surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
                loss = -surrogate.mean()
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                norm = nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
                self.opt.step()
                with torch.no_grad():
                    stats["loss"].append(float(loss))
                    stats["clip_fraction"].append(float(((ratio - 1).abs() > self.clip).float().mean()))
                    stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
                    stats["ratio_dev"].append(float((ratio - 1).abs().mean()))
                    stats["grad_norm"].append(float(norm))
        self.updates += 1
        return {k: (float(np.mean(v)) if v else math.nan) for k, v in stats.items()}
