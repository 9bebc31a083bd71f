"""The fused FlowVLA sampler: an equivalent re-parameterisation of a trained :class:`FlowVLA` with fewer kernels.

:func:`fuse` builds it from a plain model (so it loads today's checkpoints: ``fuse(load_policy(path))``):

- every LayerNorm's affine is folded into the linear that reads it (``W' = W diag(g)``, ``b' = W beta + b``, in
  float64): the blocks' pre-attention and pre-MLP norms, the expert's per-layer prefix norms and its output norm;
- the query and key/value projections of each block are one ``qkv`` linear;
- the expert's flow-time input for the ``K`` fixed times, ``in_proj.bias + pos + time_mlp(embedding(t_k))``, is a
  ``[K, H, width]`` buffer computed once (no time MLP in the sampler);
- the prefix's per-layer keys/values come from one layer norm and one batched matmul over all layers, stored once
  per chunk with room for the action tokens' own: each expert block writes its ``H`` rows in place at each step
  instead of concatenating (and so copying) the whole prefix again;
- attention takes an additive float mask built once per chunk (0 on valid keys, -inf on PAD) in the dtype the
  attention runs in, its rows padded to 16 elements so CUDA's memory-efficient kernel reads it in place, instead of
  a boolean mask SDPA converts on every call. (Padding needs a mask, so SDPA's flash kernel stays out of reach.)
- the encoder's final norm, which the policy never reads, is dropped.

Equal up to float rounding, not byte-equal: ``tests/policies/test_fused.py`` bounds the difference on the shipped
checkpoints in fp32. The config of a fused model is a :class:`FusedFlowVLAConfig`, whose JSON (and so the runner's
fingerprint) says ``"variant": "fused"``. Inference only (no ``loss``); not saved as a checkpoint: save the plain
model and fuse at load.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.kernels.attention import attend
from rollcap.kernels.ops import cfg_euler_step
from rollcap.policies.flow_vla import FlowVLA, FlowVLAConfig, guidance_inputs, split_branches
from rollcap.policies.layers import Block, CompiledRegions, timestep_embedding

MASK_ALIGN = 16
"""Key-mask rows are allocated to a multiple of this many elements (CUDA memory-efficient attention's alignment)."""


@dataclasses.dataclass(frozen=True)
class FusedFlowVLAConfig(FlowVLAConfig):
    """A :class:`FlowVLAConfig` whose model is the fused re-parameterisation (``"variant": "fused"`` in its JSON)."""

    fused_from: str = ""
    """The ``weights_digest`` of the checkpoint it was fused from (in the JSON when known: replay finds the checkpoint by it)."""

    def to_json(self) -> dict:
        d = {k: v for k, v in super().to_json().items() if k != "fused_from"}
        return {**d, "variant": "fused", **({"fused_from": self.fused_from} if self.fused_from else {})}


def _fold(norm: nn.LayerNorm, lin: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """``lin(norm(x)) == lin'(layer_norm(x))`` with the norm's affine moved into ``lin'`` (float64, then float32)."""
    w, g, beta = lin.weight.double(), norm.weight.double(), norm.bias.double()
    return (w * g[None, :]).float(), (w @ beta + lin.bias.double()).float()


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device)
    with torch.no_grad():
        lin.weight.copy_(weight)
        lin.bias.copy_(bias)
    return lin


class FusedBlock(nn.Module):
    """A pre-norm block with norm affines folded and one ``qkv`` projection; keys may be prefixed by cached ones."""

    def __init__(self, blk: Block):
        super().__init__()
        a = blk.attn
        self.heads, self.eps1, self.eps2 = a.heads, blk.ln1.eps, blk.ln2.eps
        wq, bq = _fold(blk.ln1, a.q)
        wkv, bkv = _fold(blk.ln1, a.kv)
        self.qkv = _linear(torch.cat([wq, wkv]), torch.cat([bq, bkv]))
        self.out = copy.deepcopy(a.out)
        self.fc1 = _linear(*_fold(blk.ln2, blk.mlp[0]))
        self.fc2 = copy.deepcopy(blk.mlp[2])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, kv_buf: torch.Tensor | None = None) -> torch.Tensor:
        """``mask``: additive ``[B, 1, 1, N_keys]``.

        ``kv_buf`` ``[B, N_prefix + N, 2, heads, head_dim]``: the prefix's keys/values with room for this block's
        own, which are written into its last ``N`` rows (in place: the prefix is not copied at every step).
        """
        w = x.shape[-1]
        qkv = self.qkv(F.layer_norm(x, (w,), eps=self.eps1))
        x = x + self.out(attend(qkv, self.heads, mask, kv_buf))
        return x + self.fc2(F.gelu(self.fc1(F.layer_norm(x, (w,), eps=self.eps2)), approximate="tanh"))


def additive_mask(valid: torch.Tensor, extra: int = 0) -> torch.Tensor:
    """``[B, 1, 1, N + extra]``: 0 where ``valid`` ``[B, N]`` (and on ``extra`` trailing keys), -inf elsewhere; a
    per-query ``valid`` ``[B, Nq, N]`` gives ``[B, 1, Nq, N + extra]``.

    In the dtype attention runs in (autocast's, else float32), rows allocated to a multiple of :data:`MASK_ALIGN`.
    """
    dev = valid.device
    dtype = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else torch.float32
    *lead, n = valid.shape
    total = n + extra
    pad = -total % MASK_ALIGN
    zero = torch.zeros((), dtype=dtype, device=dev)
    rows = torch.cat(
        [
            torch.where(valid, zero, torch.full((), -math.inf, dtype=dtype, device=dev)),
            torch.zeros(*lead, extra + pad, dtype=dtype, device=dev),
        ],
        dim=-1,
    )
    return rows.view(lead[0], 1, *(lead[1:] or [1]), total + pad)[..., :total]


def with_room(kv: torch.Tensor, room: int) -> torch.Tensor:
    """Prefix keys/values ``[depth, B, N, 2, heads, head_dim]`` with ``room`` zero rows after them (the action
    tokens' own keys/values, written by each expert block at each step)."""
    return torch.cat([kv, kv.new_zeros(kv.shape[0], kv.shape[1], room, *kv.shape[3:])], dim=2)


def branch_rows(x: torch.Tensor, branches: int) -> torch.Tensor:
    """``x`` ``[N, H, A]`` as the guidance branches' rows ``[branches * N, H, A]`` (a copy, as linear makes of an
    expand; ``x`` itself for one)."""
    return x if branches == 1 else x.repeat(branches, 1, 1)


class FusedExpert(nn.Module):
    """The action expert, fused (see the module docstring)."""

    def __init__(self, expert: nn.Module, cfg: FlowVLAConfig):
        super().__init__()
        self.blocks = nn.ModuleList(FusedBlock(b) for b in expert.blocks)
        projs = expert.prefix_proj if hasattr(expert, "prefix_proj") else [b.attn.kv for b in expert.blocks]
        folded = [_fold(ln, p) for ln, p in zip(expert.prefix_ln, projs)]
        self.prefix_w = nn.Parameter(torch.stack([w.t() for w, _ in folded]))  # [depth, width, 2 * expert width]
        self.prefix_b = nn.Parameter(torch.stack([b[None, :] for _, b in folded]))  # [depth, 1, 2 * expert width]
        self.prefix_eps = expert.prefix_ln[0].eps
        self.in_w = nn.Parameter(expert.in_proj.weight.detach().clone())
        k = cfg.num_steps
        with torch.no_grad():
            times = torch.tensor([1.0 - i / k for i in range(k)] + [0.0], device=self.in_w.device)
            te = expert.time_mlp(timestep_embedding(times, expert.width))  # the K step times, then t = 0
            base = expert.in_proj.bias + expert.pos  # [H, w]
        self.register_buffer(
            "step_bias", base[None] + te[:k, None, :]
        )  # [K, H, w]: what in_proj(x) is offset by at step k
        self.register_buffer("base", base.clone())
        self.register_buffer("time_emb", te.clone())  # [K + 1, w] (prefix-conditioned sampling mixes per token)
        self.out = _linear(*_fold(expert.ln_out, expert.out))
        self.out_eps = expert.ln_out.eps
        self.width = expert.width

    def prefix_kv(self, hidden: list[torch.Tensor]) -> torch.Tensor:
        """All layers' prefix keys/values: ``[depth, B, N, 2, heads, head_dim]`` (one norm, one batched matmul)."""
        depth = len(hidden)
        b, n, w = hidden[0].shape
        x = F.layer_norm(torch.stack(hidden).view(depth, b * n, w), (w,), eps=self.prefix_eps)
        heads = self.blocks[0].heads
        return torch.baddbmm(self.prefix_b, x, self.prefix_w).view(depth, b, n, 2, heads, self.width // heads)

    def forward(self, x, step_bias, kv, mask, branches: int = 1) -> torch.Tensor:
        """Velocity ``[B, H, A]`` of ``x`` at one step (``step_bias``: that step's ``[H, w]`` or ``[B, H, w]`` row).

        ``branches``: ``x`` is ``[B / branches, H, A]``, the rows of each guidance branch (``[N positive, N
        dropped]``: :func:`branch_rows`)."""
        z = F.linear(branch_rows(x, branches), self.in_w) + step_bias
        for i, blk in enumerate(self.blocks):
            z = blk(z, mask, kv[i])
        return self.out(F.layer_norm(z, (self.width,), eps=self.out_eps))


class FusedFlowVLA(CompiledRegions, nn.Module):
    """A fused :class:`FlowVLA` for sampling (:meth:`sample`, :meth:`sample_rows`, :meth:`inpaint_sample`, :meth:`guided_sample`)."""

    REGIONS = ("guided_prefix", "step")
    FP8_SCOPE = ("expert.blocks",)
    """As :attr:`FlowVLA.FP8_SCOPE`."""

    def __init__(self, plain: FlowVLA, fused_from: str = ""):
        super().__init__()
        cfg = plain.cfg
        self.cfg = FusedFlowVLAConfig(
            **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(FlowVLAConfig)}, fused_from=fused_from
        )
        src = plain.encoder
        enc = copy.deepcopy(
            src, memo={id(src.blocks): nn.ModuleList(), id(src.ln_out): None}
        )  # the blocks are rebuilt, not copied
        enc.blocks = nn.ModuleList(FusedBlock(b) for b in src.blocks)
        del enc.ln_out  # the policy reads the per-layer inputs only
        self.encoder = enc
        self.adv_emb = copy.deepcopy(plain.adv_emb)
        self.expert = FusedExpert(plain.expert, cfg)
        self.register_buffer("cfg_adv", plain.cfg_adv.clone(), persistent=False)

    def shared_inputs(self, images, state, tokens, adv):
        """A shared prefix's sequence (:meth:`~rollcap.policies.layers.PrefixEncoder.shared_sequence`), its additive
        mask ``[b, 1, N, N]``, the observation's length and the branch count, and the expert's key mask."""
        enc = self.encoder
        x, valid = enc.embed_obs(images, state, tokens)
        seq, allowed, branch_valid = enc.shared_sequence(x, valid, self.adv_emb(adv)[:, None, :] + enc.extra_pos)
        r = adv.shape[0] // x.shape[0]
        return seq, additive_mask(allowed), x.shape[1], r, additive_mask(branch_valid, self.cfg.horizon)

    def guided_prefix(self, images, state, tokens, adv):
        """Keys/values ``[depth, B, N + H, 2, heads, head_dim]`` (the last ``H`` rows: room for the expert's own) and the additive key mask.

        With ``shared_prefix`` the observation comes at its own batch and ``adv`` has a row per branch (as
        :meth:`FlowVLA.prefix_hidden`).
        """
        if self.cfg.shared_prefix:
            return self._shared_prefix(images, state, tokens, adv)
        x, valid = self.encoder.embed(images, state, tokens, self.adv_emb(adv)[:, None, :])
        mask = additive_mask(valid, self.cfg.horizon)
        enc_mask = mask[..., : valid.shape[1]]
        hidden = []
        for blk in self.encoder.blocks:
            hidden.append(x)
            x = blk(x, enc_mask)
        return with_room(self.expert.prefix_kv(hidden), self.cfg.horizon), mask

    def _shared_prefix(self, images, state, tokens, adv):
        x, enc_mask, n_obs, r, mask = self.shared_inputs(images, state, tokens, adv)
        hidden = []
        for blk in self.encoder.blocks:
            hidden.append(x)
            x = blk(x, enc_mask)
        kv = split_branches(self.expert.prefix_kv(hidden), n_obs, r, batch_dim=1)
        return with_room(kv, self.cfg.horizon), mask

    def _guided(self, images, state, tokens, rows=None):
        """The guided prefix of ``rows`` observations (None: one, batch 1), both branches (``[rows positive, rows dropped]``)."""
        inputs = guidance_inputs(self.cfg_adv, images, state, tokens, rows, self.cfg.shared_prefix)
        return self._region("guided_prefix")(*inputs)

    def step(self, x: torch.Tensor, step_bias: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One guided Euler step of ``x [N, H, A]`` (both branches through the expert, then the guided update).

        A compiled region: inductor fuses the update into the expert's last kernels (``cfg_euler_step`` takes its
        reference arithmetic while compiling).
        """
        n = x.shape[0]
        v = self.expert(x, step_bias, kv, mask, branches=2)  # both branches' rows, from x's
        return cfg_euler_step(x, v[n:], v[:n], -1.0 / self.cfg.num_steps, self.cfg.cfg_beta)

    def _euler(self, x, kv, mask, bias_of, keep=None, pinned=None):
        step = self._region("step")
        for k in range(self.cfg.num_steps):
            x = step(x, bias_of(k), kv, mask)
            if keep is not None:
                x = x * keep + pinned
        return x

    def sample(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """As :meth:`FlowVLA.sample` (batch 1, guided; capturable)."""
        kv, mask = self._guided(images, state, tokens)
        return self._euler(noise, kv, mask, lambda k: self.expert.step_bias[k])

    def sample_rows(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """As :meth:`FlowVLA.sample_rows` (batch N: N positive rows, then N dropped)."""
        kv, mask = self._guided(images, state, tokens, rows=noise.shape[0])
        return self._euler(noise, kv, mask, lambda k: self.expert.step_bias[k])

    def guided_sample(self, images, state, tokens, noise, carried, weights) -> torch.Tensor:
        """As :func:`rollcap.policies.rtc.guided_sample`: each step's clean estimate blended towards ``carried`` (``weights`` ``[1, H, 1]``; capturable)."""
        cfg, e = self.cfg, self.expert
        kv, mask = self._guided(images, state, tokens)
        x, dt = noise, -1.0 / cfg.num_steps
        for k in range(cfg.num_steps):
            tk = 1.0 - k / cfg.num_steps
            v = e(x.repeat(2, 1, 1), e.step_bias[k], kv, mask)
            v_u, v_c = v[1:2], v[0:1]
            vel = v_u + cfg.cfg_beta * (v_c - v_u)  # the plain guided sampler's arithmetic
            x0 = x - tk * vel
            x = x + dt * (vel - weights * (carried - x0) / tk)
        return x

    def inpaint_sample(self, images, state, tokens, noise, carried, weights) -> torch.Tensor:
        """As :meth:`FlowVLA.inpaint_sample` (a prefix-conditioned model; ``weights`` 0/1)."""
        kv, mask = self._guided(images, state, tokens)
        keep = 1.0 - weights
        pinned = carried * weights
        e = self.expert
        te, te0 = e.time_emb[:-1], e.time_emb[-1]
        bias = e.base + te0 + keep[0] * (te - te0)[:, None, :]  # [K, H, w]: clean (t = 0) tokens where kept
        return self._euler(noise * keep + pinned, kv, mask, lambda k: bias[k], keep, pinned)


def fuse(model: FlowVLA, fused_from: str = "") -> FusedFlowVLA:
    """The fused sampler of a plain :class:`FlowVLA` (its weights re-parameterised; ``model`` is not changed).

    ``fused_from``: the checkpoint's ``weights_digest``, kept in the config (so in a runner's fingerprint).
    """
    if not isinstance(model, FlowVLA):
        raise TypeError(f"fuse: expected a FlowVLA, got {type(model).__name__}")
    # The folds are matrix products: their bits depend on how many threads split the sums (measured: 1 vs 2
    # threads gave other fused weights, so other chunks). One thread, whatever the caller's budget.
    outer = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return FusedFlowVLA(model, fused_from).eval()
    finally:
        torch.set_num_threads(outer)
