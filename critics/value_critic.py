"""ValueCritic: observation -> value, RECAP-style.

The value of a state is the normalised negative number of steps until
success, in ``[-1, 0]`` (``-steps_to_success / max_steps``; failures are
``-1``). The critic predicts a distribution over ``n_bins`` evenly spaced
values in that range; the value is the distribution's mean. It reuses the
policy's prefix encoder architecture with its own weights and a readout token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.policies.layers import PrefixEncoder
from rollcap.policies.observation import ObsModelConfig


@dataclass(frozen=True)
class ValueCriticConfig(ObsModelConfig):
    """Shape settings of a :class:`ValueCritic`."""

    image_keys: tuple[str, ...] = ("image_front",)
    """Observation keys of the camera images."""
    image_size: int = 64
    """Square image side in pixels."""
    patch_size: int = 16
    """Patch side for image tokens."""
    state_dim: int = 28
    """Length of the state vector."""
    state_group: int = 4
    """State dims per prefix token (0: the whole state as one token). 4 gives one token per object of PushBlock."""
    max_tokens: int = 48
    """Instruction token budget."""
    width: int = 96
    """Transformer width."""
    depth: int = 2
    """Encoder blocks."""
    heads: int = 4
    """Attention heads."""
    n_bins: int = 41
    """Value bins over [-1, 0]."""

    LIMITS = {**ObsModelConfig.LIMITS, "n_bins": 65536}

    def __post_init__(self):
        self._check_obs_fields()
        self._require_int("n_bins", 2, self.LIMITS["n_bins"])


class ValueCritic(nn.Module):
    """Distributional value over ``[-1, 0]``; see the module docstring."""

    def __init__(self, cfg: ValueCriticConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = PrefixEncoder(
            cfg.obs_spec, cfg.width, cfg.depth, cfg.heads, cfg.patch_size, n_extra=1, state_group=cfg.state_group
        )
        self.readout = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.head = nn.Sequential(
            nn.Linear(cfg.width, cfg.width), nn.GELU(approximate="tanh"), nn.Linear(cfg.width, cfg.n_bins)
        )
        self.register_buffer("centers", torch.linspace(-1.0, 0.0, cfg.n_bins), persistent=False)

    def logits(self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        b = state.shape[0]
        _, final, _ = self.encoder(images, state, tokens, self.readout.expand(b, -1, -1))
        return self.head(final[:, -1])

    def value(self, images, state, tokens) -> torch.Tensor:
        """Mean of the predicted distribution, shape ``[B]`` (capturable)."""
        return (F.softmax(self.logits(images, state, tokens), dim=-1) * self.centers).sum(-1)

    def loss(self, images, state, tokens, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against a two-hot encoding of ``target`` in ``[-1, 0]``."""
        n = self.cfg.n_bins
        pos = (target.clamp(-1.0, 0.0) + 1.0) * (n - 1)
        lo = pos.floor().long().clamp(0, n - 1)
        hi = (lo + 1).clamp(max=n - 1)
        w_hi = pos - lo.to(pos.dtype)
        dist = torch.zeros(target.shape[0], n, device=target.device)
        dist.scatter_add_(1, lo[:, None], (1 - w_hi)[:, None])
        dist.scatter_add_(1, hi[:, None], w_hi[:, None])
        return -(dist * F.log_softmax(self.logits(images, state, tokens), dim=-1)).sum(-1).mean()
