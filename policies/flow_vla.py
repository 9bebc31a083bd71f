"""FlowVLA: a small pi0-style vision-language-action flow-matching policy.

Observation (camera images, a byte-tokenised instruction, proprio state) and a
RECAP-style advantage indicator form a prefix; an action expert attends to the
prefix's per-layer keys/values and denoises an ``H x A`` action chunk from
Gaussian noise in ``K`` Euler steps (pi0 convention: ``x_1`` is noise,
``x_0`` the action, velocity target ``noise - action``). At inference the
advantage-conditioned ("positive") and unconditioned ("dropped") branches run
batched in one captured graph and are combined with classifier-free guidance
``v = v_u + beta * (v_c - v_u)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.kernels.ops import cfg_euler_step
from rollcap.policies.layers import Block, CompiledRegions, PrefixEncoder, timestep_embedding
from rollcap.policies.observation import ObsModelConfig

ADV_NEGATIVE, ADV_POSITIVE, ADV_DROPPED = 0, 1, 2


@dataclass(frozen=True)
class FlowVLAConfig(ObsModelConfig):
    """Shape and sampling settings of a :class:`FlowVLA`."""

    image_keys: tuple[str, ...] = ("image_front",)
    """Observation keys of the camera images (uint8 HxWx3 each)."""
    image_size: int = 64
    """Square image side in pixels."""
    patch_size: int = 16
    """Patch side for the image tokens."""
    state_dim: int = 28
    """Length of the proprio/object state vector."""
    action_dim: int = 2
    """Action dimension A."""
    horizon: int = 8
    """Actions per chunk H."""
    state_group: int = 4
    """State dims per prefix token (0: the whole state as one token). 4 gives one token per object of PushBlock."""
    max_tokens: int = 48
    """Instruction token budget (bytes + BOS + EOS); longer instructions are refused."""
    width: int = 128
    """Transformer width."""
    depth: int = 3
    """Blocks in the prefix encoder and in the action expert."""
    heads: int = 4
    """Attention heads."""
    num_steps: int = 10
    """Euler steps K of the flow sampler."""
    execute_steps: int = 4
    """Actions of each chunk to execute before re-planning (deployment default; 1..horizon)."""
    cfg_beta: float = 1.0
    """Guidance weight beta (1.0: conditioned branch only in effect)."""
    adv_dropout: float = 0.3
    """Training: probability the advantage indicator is dropped (enables CFG)."""
    expert_width: int = 0
    """Action expert width (0: ``width``). A narrower expert (pi0's is 1024 wide beside a 2048-wide prefix) projects
    the prefix's hidden states to its own keys/values. Omitted from the JSON when 0."""
    mlp_ratio: int = 2
    """MLP hidden width over the block width (prefix and expert). Omitted from the JSON when 2."""
    prefix_conditioning: bool = False
    """Trained with a clean action prefix (real-time chunking's hard-prefix variant): each action token has its own
    flow time, 0 on the prefix; sampling pins the prefix (:meth:`FlowVLA.inpaint_sample`). Omitted from the JSON when
    False, so checkpoints without it keep their config and fingerprint."""
    shared_prefix: bool = False
    """The observation's tokens do not attend to the advantage indicator (the prefix's last token, which attends to
    them; the action expert reads both), so the guidance branches share the observation's prefix: a guided chunk
    runs it once, at the observation's batch, and only the indicator token per branch, about half the prefix's
    work. The indicator then reaches the actions through its own keys/values alone. Another model, not a faster
    path to the same one: a checkpoint is trained with it or without it. Omitted from the JSON when False."""

    LIMITS = {**ObsModelConfig.LIMITS, "action_dim": 4096, "horizon": 4096, "num_steps": 1000}

    def __post_init__(self):
        self._check_obs_fields()
        if self.width % 2:
            raise self._fail("width", "an even int (the flow-time embedding is sin + cos halves)")
        for name in ("action_dim", "horizon", "num_steps"):
            self._require_int(name, 1, self.LIMITS[name])
        self._require_int("execute_steps", 1, self.horizon)
        self._require_number("cfg_beta")
        self._require_number("adv_dropout")
        if not 0.0 <= self.adv_dropout < 1.0:
            raise self._fail("adv_dropout", "a probability in [0, 1)")
        for name in ("prefix_conditioning", "shared_prefix"):
            if not isinstance(getattr(self, name), bool):
                raise self._fail(name, "true or false")
        self._require_int("expert_width", 0, self.LIMITS["width"])
        if self.expert_width and (self.expert_width % 2 or self.expert_width % self.heads):
            raise self._fail("expert_width", f"0 or an even multiple of heads {self.heads}")
        self._require_int("mlp_ratio", 1, 64)

    def to_json(self) -> dict:
        d = super().to_json()
        for name, default in (
            ("prefix_conditioning", False),
            ("shared_prefix", False),
            ("expert_width", 0),
            ("mlp_ratio", 2),
        ):
            if d[name] == default:
                del d[
                    name
                ]  # a checkpoint without the field keeps its config (and fingerprint) as before the field existed
        return d


def guidance_inputs(cfg_adv: torch.Tensor, images, state, tokens, rows, shared: bool):
    """The prefix's inputs for both guidance branches of ``rows`` observations (None: one, at batch 1): the advantage
    rows (``rows`` positive, then ``rows`` dropped), and the observation repeated per branch unless the prefix is
    shared (then it stays at its own batch). ``rows`` is tested against None only: under tracing it is a traced size."""
    if rows is None:
        if shared:
            return images, state, tokens, cfg_adv
        return [i.expand(2, -1, -1, -1) for i in images], state.expand(2, -1), tokens.expand(2, -1), cfg_adv
    adv = cfg_adv[:, None].expand(2, rows).reshape(-1)
    if shared:
        return images, state, tokens, adv
    return [i.repeat(2, 1, 1, 1) for i in images], state.repeat(2, 1), tokens.repeat(2, 1), adv


def split_branches(t: torch.Tensor, n_obs: int, branches: int, batch_dim: int = 0) -> torch.Tensor:
    """A shared prefix's keys or values, tokens on axis 2 (``n_obs`` observation tokens, then ``branches`` branches'
    extra tokens), as each branch's: the observation's tokens, then the branch's own; the batch (axis ``batch_dim``)
    grows from ``b`` to ``branches * b``, branch-major."""
    ext = t.narrow(2, n_obs, t.shape[2] - n_obs).unflatten(2, (branches, -1)).movedim(2, batch_dim)
    reps = [1] * t.dim()
    reps[batch_dim] = branches
    return torch.cat([t.narrow(2, 0, n_obs).repeat(reps), ext.flatten(batch_dim, batch_dim + 1)], dim=2)


class ActionExpert(nn.Module):
    """Denoises action tokens while attending to the prefix's per-layer keys/values."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        w = cfg.expert_width or cfg.width
        self.in_proj = nn.Linear(cfg.action_dim, w)
        self.time_mlp = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
        self.pos = nn.Parameter(torch.zeros(cfg.horizon, w))
        self.prefix_ln = nn.ModuleList(nn.LayerNorm(cfg.width) for _ in range(cfg.depth))
        self.blocks = nn.ModuleList(Block(w, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        if w != cfg.width:  # a narrower expert: the prefix's keys/values through their own projection
            self.prefix_proj = nn.ModuleList(nn.Linear(cfg.width, 2 * w) for _ in range(cfg.depth))
        self.ln_out = nn.LayerNorm(w)
        self.out = nn.Linear(w, cfg.action_dim)
        nn.init.normal_(self.pos, std=0.02)
        self.width = w

    def prefix_kv(
        self, hidden: list, n_obs: int | None = None, branches: int = 1
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Project the prefix's per-layer hidden states once per chunk.

        A shared prefix (:meth:`~rollcap.policies.layers.PrefixEncoder.forward_shared`: ``n_obs`` observation tokens
        followed by ``branches`` branches' extra tokens per sequence) is projected once, then split: each branch's
        keys/values are the observation's followed by its own extra tokens', ``[branches * b, heads, n_obs + n_extra,
        head_dim]`` (branch-major, as the advantage rows are).
        """
        out = []
        for i, h in enumerate(hidden):
            kv = self._layer_kv(i, h)
            out.append(kv if n_obs is None else tuple(split_branches(t, n_obs, branches) for t in kv))
        return out

    def _layer_kv(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blk, ln = self.blocks[i], self.prefix_ln[i]
        if not hasattr(self, "prefix_proj"):
            return blk.attn.project_kv(ln(h))
        k, v = self.prefix_proj[i](ln(h)).chunk(2, dim=-1)
        return blk.attn.split(k), blk.attn.split(v)

    def forward(self, x: torch.Tensor, t: torch.Tensor, kv: list, mask: torch.Tensor) -> torch.Tensor:
        """``t``: flow time ``[B]`` (one per chunk), or ``[B, H]`` (one per action token: prefix-conditioned models)."""
        b, h, _ = x.shape
        if t.dim() == 1:
            z = self.in_proj(x) + self.pos + self.time_mlp(timestep_embedding(t, self.width))[:, None, :]
        else:
            z = self.in_proj(x) + self.pos + self.time_mlp(timestep_embedding(t.reshape(-1), self.width)).view(b, h, -1)
        full_mask = torch.cat([mask, torch.ones(b, h, dtype=torch.bool, device=x.device)], dim=1)
        for blk, pkv in zip(self.blocks, kv):
            z = blk(z, full_mask, pkv)
        return self.out(self.ln_out(z))


class FlowVLA(CompiledRegions, nn.Module):
    """The policy network; see the module docstring.

    Compiled regions (:class:`~rollcap.policies.layers.CompiledRegions`): the guided prefix and one expert step.
    """

    REGIONS = ("cfg_prefix", "expert")
    FP8_SCOPE = ("expert.blocks",)
    """Where the ``fp8`` precision runs the linears at float8 (:func:`rollcap.kernels.fp8.to_fp8`): the expert's blocks."""

    def __init__(self, cfg: FlowVLAConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = PrefixEncoder(
            cfg.obs_spec,
            cfg.width,
            cfg.depth,
            cfg.heads,
            cfg.patch_size,
            n_extra=1,
            state_group=cfg.state_group,
            mlp_ratio=cfg.mlp_ratio,
        )
        self.adv_emb = nn.Embedding(3, cfg.width)
        self.expert = ActionExpert(cfg)
        # The guided sampler's advantage pair, built once on the model's device: a tensor made from host data
        # inside the captured sampler is a host-to-device copy that CUDA graph capture refuses. Not persistent:
        # checkpoints (and their weights digest) are unchanged.
        self.register_buffer("cfg_adv", torch.tensor([ADV_POSITIVE, ADV_DROPPED]), persistent=False)

    def prefix_hidden(self, images, state, tokens, adv) -> tuple[list, torch.Tensor, dict]:
        """The encoder's per-layer hidden states, the expert's key mask for advantage rows ``adv``, and how
        :meth:`ActionExpert.prefix_kv` reads the hidden states (its keyword arguments).

        Without ``shared_prefix`` the observation's batch is ``adv``'s; with it, ``adv`` may have ``r`` rows per
        observation (row ``j`` is observation ``j % b``'s), and the observation runs once
        (:meth:`~rollcap.policies.layers.PrefixEncoder.forward_shared`).
        """
        extra = self.adv_emb(adv)[:, None, :]
        if self.cfg.shared_prefix:
            hidden, n_obs, valid = self.encoder.forward_shared(images, state, tokens, extra)
            return hidden, valid, {"n_obs": n_obs, "branches": adv.shape[0] // state.shape[0]}
        hidden, _, valid = self.encoder(images, state, tokens, extra)
        return hidden, valid, {}

    def _prefix(self, images, state, tokens, adv):
        hidden, valid, split = self.prefix_hidden(images, state, tokens, adv)
        return self.expert.prefix_kv(hidden, **split), valid

    def cfg_prefix(self, images, state, tokens):
        """The prefix of one observation for classifier-free guidance: batch 2, advantage positive / dropped."""
        return self._prefix(*guidance_inputs(self.cfg_adv, images, state, tokens, None, self.cfg.shared_prefix))

    def velocity(self, images, state, tokens, adv, x_t, t) -> torch.Tensor:
        """Predicted flow velocity for a batch (training and tests)."""
        kv, valid = self._prefix(images, state, tokens, adv)
        return self.expert(x_t, t, kv, valid)

    def loss(self, images, state, tokens, adv, actions, generator: torch.Generator | None = None) -> torch.Tensor:
        """Flow-matching loss with advantage dropout (RECAP): ``adv`` is 0/1 per sample."""
        b = actions.shape[0]
        dev = actions.device
        drop = torch.rand(b, generator=generator, device=dev) < self.cfg.adv_dropout
        adv = torch.where(drop, torch.full_like(adv, ADV_DROPPED), adv)
        t = torch.rand(b, generator=generator, device=dev) * 0.999 + 0.001
        noise = torch.randn(actions.shape, generator=generator, device=dev)
        x_t = t[:, None, None] * noise + (1.0 - t[:, None, None]) * actions
        v = self.velocity(images, state, tokens, adv, x_t, t)
        return F.mse_loss(v, noise - actions)

    def sample(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """Batch-1 guided sampling: ``noise [1,H,A]`` -> actions ``[1,H,A]`` (capturable).

        A prefix-conditioned model samples through :meth:`inpaint_sample` with an empty prefix (its per-token time path).
        """
        cfg = self.cfg
        if cfg.prefix_conditioning:
            zero = torch.zeros_like(noise)
            return self.inpaint_sample(images, state, tokens, noise, zero, zero[..., :1])
        kv, valid = self._region("cfg_prefix")(images, state, tokens)
        x = noise
        dt = -1.0 / cfg.num_steps
        for k in range(cfg.num_steps):
            t = torch.full((2,), 1.0 - k / cfg.num_steps, device=state.device)
            v = self._region("expert")(x.expand(2, -1, -1), t, kv, valid)
            x = cfg_euler_step(x, v[1:2], v[0:1], dt, cfg.cfg_beta)
        return x

    def sample_rows(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """Batch-N guided sampling: ``noise [N,H,A]`` -> actions ``[N,H,A]`` (capturable; the batched runner's sampler).

        Each row is :meth:`sample` of its own observation and noise, the same ops in the same order, over
        ``2N`` rows (N advantage-positive, then N dropped); whether a row is the same bits as at batch 1 is
        the kernels' matter (measured in ``tests/rollout/test_batch.py``). A prefix-conditioned model takes
        :meth:`inpaint_sample`'s path with an empty prefix, as :meth:`sample` does.
        """
        cfg, n = self.cfg, noise.shape[0]
        kv, valid = self._prefix(*guidance_inputs(self.cfg_adv, images, state, tokens, n, cfg.shared_prefix))
        x, dt = noise, -1.0 / cfg.num_steps
        if cfg.prefix_conditioning:
            zero = torch.zeros_like(noise)
            keep, pinned = 1.0 - zero[..., :1], zero * zero[..., :1]
            x = noise * keep + pinned
        for k in range(cfg.num_steps):
            if cfg.prefix_conditioning:
                t = (keep[..., 0] * (1.0 - k / cfg.num_steps)).repeat(2, 1)
            else:
                t = torch.full((2 * n,), 1.0 - k / cfg.num_steps, device=state.device)
            v = self.expert(x.repeat(2, 1, 1), t, kv, valid)
            x = cfg_euler_step(x, v[n:], v[:n], dt, cfg.cfg_beta)
            if cfg.prefix_conditioning:
                x = x * keep + pinned
        return x

    def inpaint_sample(self, images, state, tokens, noise, carried, weights) -> torch.Tensor:
        """Hard-prefix sampling for a prefix-conditioned model: where ``weights`` ``[1,H,1]`` is 1 the token is ``carried``.

        Those tokens are clean (flow time 0) at every Euler step, as in training, and the rest are denoised
        conditioned on them; the output holds ``carried`` exactly there. No guidance term: the same work as
        :meth:`sample`, capturable. ``weights`` must be 0/1 (real-time chunking's hard mask).
        """
        cfg = self.cfg
        kv, valid = self._region("cfg_prefix")(images, state, tokens)
        keep = 1.0 - weights
        pinned = carried * weights
        x = noise * keep + pinned
        dt = -1.0 / cfg.num_steps
        for k in range(cfg.num_steps):
            t = (keep[..., 0] * (1.0 - k / cfg.num_steps)).expand(2, -1)
            v = self._region("expert")(x.expand(2, -1, -1), t, kv, valid)
            x = cfg_euler_step(x, v[1:2], v[0:1], dt, cfg.cfg_beta) * keep + pinned
        return x
