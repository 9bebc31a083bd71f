"""Transformer layers and the observation prefix encoder (shared with the critic).

Everything here is capturable: fixed shapes, no value-dependent branches, no
randomness. Images are patchified by reshape + linear (no conv algorithm
choice to vary between runs).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.policies.observation import PAD, VOCAB_SIZE, ObsSpec


N_FREQS = 4


class CompiledRegions:
    """Mixin: named regions (submodules or methods) a compiler may stand in for while a context is open.

    The ``compile-cuda`` graph backend (:mod:`rollcap.kernels.compiled`) compiles each region once with inductor
    and opens :meth:`compiled_regions` around the warm-up runs and the CUDA graph capture; the Python between the
    regions (a sampler's Euler loop) is recorded by the capture, so a chunk is still one graph replay. Outside the
    context every call takes the plain module: the eager reference path is untouched. Single-threaded: do not
    call the model from another thread while the context is open.
    """

    REGIONS: tuple[str, ...] = ()
    """Attribute names of the regions, each called as ``self.<name>(...)`` by the sampler through :meth:`_region`."""

    def _region(self, name: str) -> Callable:
        active = self.__dict__.get("_regions_active")
        return active[name] if active else getattr(self, name)

    def release_compiled(self) -> None:
        """Drop every compiled region (and what it holds: frozen weights). A graph captured over them must be gone first."""
        self.__dict__.pop("_regions_built", None)

    @contextlib.contextmanager
    def compiled_regions(self, compile: Callable[[Callable], Callable]) -> Iterator[None]:
        """Route every region through ``compile(region)`` (built on first use, kept) inside the block."""
        built = self.__dict__.setdefault("_regions_built", {})
        if compile not in built:
            built[compile] = {name: compile(getattr(self, name)) for name in self.REGIONS}
        outer = self.__dict__.get("_regions_active")
        self.__dict__["_regions_active"] = built[compile]
        try:
            yield
        finally:
            self.__dict__["_regions_active"] = outer


class Attention(nn.Module):
    """Multi-head attention whose keys/values may be prefixed by cached ones."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        return x.view(b, n, self.heads, w // self.heads).transpose(1, 2)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv(x).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """``mask``: bool ``[B, N_keys]`` (every query alike) or ``[B, N, N_keys]`` (per query), True where a key may
        be attended."""
        q = self.split(self.q(x))
        k, v = self.project_kv(x)
        if prefix_kv is not None:
            k = torch.cat([prefix_kv[0], k], dim=2)
            v = torch.cat([prefix_kv[1], v], dim=2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None] if mask.dim() == 3 else mask[:, None, None])
        b, h, n, d = o.shape
        return self.out(o.transpose(1, 2).reshape(b, n, h * d))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 2):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, prefix_kv=None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask, prefix_kv)
        return x + self.mlp(self.ln2(x))


class PrefixEncoder(nn.Module):
    """Images + instruction tokens + proprio state (+ extra tokens) -> per-layer hidden states.

    Returns the input of every block (for an action expert's cross-layer
    attention), the final hidden state, and the key mask (False on PAD tokens).
    """

    def __init__(
        self,
        spec: ObsSpec,
        width: int,
        depth: int,
        heads: int,
        patch: int,
        n_extra: int,
        state_group: int = 0,
        mlp_ratio: int = 2,
    ):
        super().__init__()
        if state_group and spec.state_dim % state_group:
            raise ValueError(f"state_group {state_group} does not divide state_dim {spec.state_dim}")
        self.state_group = state_group
        if spec.image_size % patch:
            raise ValueError(f"image_size {spec.image_size} is not a multiple of patch_size {patch}")
        self.spec = spec
        self.patch = patch
        self.n_patches = (spec.image_size // patch) ** 2
        self.patch_proj = nn.Linear(patch * patch * 3, width)
        self.cam_pos = nn.Parameter(torch.zeros(len(spec.image_keys), self.n_patches, width))
        self.tok_emb = nn.Embedding(VOCAB_SIZE, width)
        self.tok_pos = nn.Parameter(torch.zeros(spec.max_tokens, width))
        if state_group == 0:
            self.state_proj = nn.Linear(spec.state_dim, width)
        else:  # one token per group of dims: Fourier features through a per-group projection
            groups, feats = spec.state_dim // state_group, state_group * (2 * N_FREQS + 1)
            # pi 2^i / 4 and the in-place scaling: the same bytes as the tensor arithmetic, but no op that takes
            # torch's Python reference path on the meta device (checkpoint.on_meta; it imports torch._dynamo)
            freqs = [math.pi * 2.0**i / 4.0 for i in range(N_FREQS)]
            self.register_buffer("state_freqs", torch.tensor(freqs, dtype=torch.float32), persistent=False)
            self.state_w = nn.Parameter(torch.randn(groups, feats, width).div_(feats**0.5))
            self.state_b = nn.Parameter(torch.zeros(groups, width))
        self.register_buffer("state_mean", torch.zeros(spec.state_dim))
        self.register_buffer("state_std", torch.ones(spec.state_dim))
        self.extra_pos = nn.Parameter(torch.zeros(n_extra, width))
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio) for _ in range(depth))
        self.ln_out = nn.LayerNorm(width)
        nn.init.normal_(self.cam_pos, std=0.02)
        nn.init.normal_(self.tok_pos, std=0.02)
        nn.init.normal_(self.extra_pos, std=0.02)

    def patchify(self, img: torch.Tensor) -> torch.Tensor:
        b, h, w, c = img.shape
        p = self.patch
        x = img.to(torch.float32).mul(1.0 / 255.0)
        x = x.view(b, h // p, p, w // p, p, c).permute(0, 1, 3, 2, 4, 5).reshape(b, (h // p) * (w // p), p * p * c)
        return self.patch_proj(x)

    def forward(self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, extra: torch.Tensor):
        x, valid = self.embed(images, state, tokens, extra)
        hidden = []
        for blk in self.blocks:
            hidden.append(x)
            x = blk(x, valid)
        return hidden, self.ln_out(x), valid

    def forward_shared(self, images, state, tokens, extra: torch.Tensor):
        """The prefix when the observation does not attend to the extra tokens (a shared guidance prefix).

        ``extra`` ``[r * b, n_extra, width]`` holds ``r`` branches' extra tokens per observation (row ``j`` belongs to
        observation ``j % b``). Each observation's sequence is its own tokens followed by every branch's extra tokens
        (:meth:`shared_sequence`): one pass at batch ``b`` (every linear reads its weights once for all branches),
        the observation's tokens attending to themselves only and each branch's extra tokens to the observation and
        to each other. Per branch that is :meth:`forward` over the whole sequence with the observation's rows masked
        off the extra keys. Returns each layer's input ``[b, N_obs + r * n_extra, width]``, the observation's
        length, and each branch's key mask ``[r * b, N_obs + n_extra]`` (for the expert:
        :meth:`~rollcap.policies.flow_vla.ActionExpert.prefix_kv` splits the branches).
        """
        x, valid = self.embed_obs(images, state, tokens)
        seq, mask, branch_valid = self.shared_sequence(x, valid, extra + self.extra_pos)
        hidden = []
        for blk in self.blocks:
            hidden.append(seq)
            seq = blk(seq, mask)
        return hidden, x.shape[1], branch_valid

    def shared_sequence(self, x: torch.Tensor, valid: torch.Tensor, extra: torch.Tensor):
        """``x`` ``[b, N_obs, width]`` followed by each branch's ``extra`` tokens (embedded); the attention mask
        ``[b, N, N]`` (observation rows see the observation's valid keys; a branch's rows see those and their own);
        and each branch's key mask for the expert, ``[r * b, N_obs + n_extra]``."""
        b, n_obs, w = x.shape
        r, n_e = extra.shape[0] // b, extra.shape[1]
        seq = torch.cat([x, extra.view(r, b, n_e, w).transpose(0, 1).reshape(b, r * n_e, w)], dim=1)
        branch = torch.arange(r * n_e, device=x.device) // n_e
        own = (branch[:, None] == branch[None, :]).expand(b, -1, -1)
        obs_keys = valid[:, None, :]
        rows_obs = torch.cat([obs_keys.expand(b, n_obs, n_obs), own.new_zeros(b, n_obs, r * n_e)], dim=2)
        rows_extra = torch.cat([obs_keys.expand(b, r * n_e, n_obs), own], dim=2)
        return seq, torch.cat([rows_obs, rows_extra], dim=1), self.extra_valid(valid.repeat(r, 1), extra)

    def embed(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor, extra: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix tokens ``[B, N, width]`` before the blocks, and the key mask ``[B, N]``."""
        x, valid = self.embed_obs(images, state, tokens)
        return torch.cat([x, extra + self.extra_pos], dim=1), self.extra_valid(valid, extra)

    @staticmethod
    def extra_valid(valid: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """The observation's key mask with the extra tokens' keys (always valid) after it."""
        return torch.cat([valid, torch.ones(valid.shape[0], extra.shape[1], dtype=torch.bool, device=valid.device)], 1)

    def embed_obs(
        self, images: list[torch.Tensor], state: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The observation's tokens ``[B, N_obs, width]`` (images, instruction, state) and their key mask."""
        b = state.shape[0]
        parts = [self.patchify(img) + self.cam_pos[i] for i, img in enumerate(images)]
        parts.append(self.tok_emb(tokens) + self.tok_pos)
        s = (state - self.state_mean) / self.state_std
        if self.state_group == 0:
            parts.append(self.state_proj(s)[:, None, :])
            n_state = 1
        else:
            f = s[:, :, None] * self.state_freqs
            feats = torch.cat([s[:, :, None], torch.sin(f), torch.cos(f)], dim=-1)
            n_state = self.state_w.shape[0]
            feats = feats.reshape(b, n_state, -1)
            parts.append(torch.einsum("bgf,gfw->bgw", feats, self.state_w) + self.state_b)
        x = torch.cat(parts, dim=1)
        n_img = len(images) * self.n_patches
        valid = torch.cat(
            [
                torch.ones(b, n_img, dtype=torch.bool, device=x.device),
                tokens != PAD,
                torch.ones(b, n_state, dtype=torch.bool, device=x.device),
            ],
            dim=1,
        )
        return x, valid


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow time ``t`` (shape ``[B]``) -> ``[B, dim]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].to(torch.float32) * freqs[None] * 100.0
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
