"""The lean FlowVLA sampler: the fused sampler (:mod:`rollcap.policies.fused`) with fewer bytes between its GEMMs.

:func:`lean` builds it from a plain model (``lean(load_policy(path))``), as :func:`~rollcap.policies.fused.fuse` does,
and changes only how each block moves its activations:

- the residual add is fused into the next layer norm (:func:`~rollcap.kernels.ops.add_layernorm`: one Triton kernel
  on CUDA reads the residual and the last GEMM's output, writes the new residual and the normalised activation, in
  the dtype the next GEMM reads): an add, a norm and a cast kernel become one, twice per block;
- the MLP's bias and GELU run in the first MLP GEMM's epilogue (:func:`~rollcap.kernels.ops.linear_gelu`: cuBLASLt on
  CUDA), so the hidden activation is written once and never re-read by a GELU pass;
- at bf16 every matmul weight (the linears and the expert's prefix key/value and input projections) is stored in
  bf16 once (:func:`~rollcap.kernels.precision.cast_linears` with :attr:`LeanExpert.CAST_PARAMS`), so no cast kernel
  runs; the encoder's block norms double as the expert's prefix norms (the same affine-free norm of the same tensor
  when the two eps agree), so the prefix's hidden states are never stacked and normalised a second time.

The residual stream stays fp32 at every precision: it sums 18 (``3b``) blocks' updates onto the embeddings, and a
bf16 stream would round each sum to 8 bits of mantissa (updates below 1/256 of the stream vanish), a drift the
fp32 stream does not have; it costs one fp32 read and write per add, which the fused kernel already makes.

On CPU every op is its torch reference, the unfused arithmetic: a lean chunk equals the fused sampler's byte for
byte there (``tests/policies/test_lean.py``). On CUDA the Triton norm and the epilogue GELU round differently from
ATen's, so a lean chunk equals its own eager reference, not the fused one (the bench states the max |diff|). The
config JSON says ``"variant": "lean"`` (with ``fused_from``); the runner's fingerprint adds which kernels ran
(:func:`~rollcap.kernels.ops.kernel_facts`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from rollcap.kernels.attention import attend, attention_facts
from rollcap.kernels.expert_step import expert_step, stack_blocks, step_facts
from rollcap.kernels.fp8 import FP8, Fp8Linear
from rollcap.kernels.ops import add_layernorm, gelu_quantize_rows_fp8, kernel_facts, linear_gelu
from rollcap.policies.flow_vla import FlowVLA, split_branches
from rollcap.policies.fused import (
    FusedBlock,
    FusedExpert,
    FusedFlowVLA,
    FusedFlowVLAConfig,
    additive_mask,
    branch_rows,
    with_room,
)


@dataclasses.dataclass(frozen=True)
class LeanFlowVLAConfig(FusedFlowVLAConfig):
    """A fused config whose model is the lean sampler (``"variant": "lean"`` in its JSON)."""

    def to_json(self) -> dict:
        return {**super().to_json(), "variant": "lean"}


class LeanBlock(nn.Module):
    """A :class:`FusedBlock` whose residual adds are fused into the norms (see the module docstring).

    ``forward(x, y, ...)`` takes the block's input ``x`` (fp32) and its normalised form ``y`` and returns the
    residual after attention and the MLP's output: the caller adds that in the next norm.
    """

    def __init__(self, blk: FusedBlock):
        super().__init__()
        self.heads, self.eps1, self.eps2 = blk.heads, blk.eps1, blk.eps2
        self.qkv, self.out, self.fc1, self.fc2 = blk.qkv, blk.out, blk.fc1, blk.fc2

    @property
    def in_dtype(self) -> torch.dtype | None:
        """The dtype the block's first norm writes: float8 pairs when its ``qkv`` runs at fp8, else the compute dtype."""
        return FP8 if isinstance(self.qkv, Fp8Linear) else None

    def forward(self, x: torch.Tensor, y, mask: torch.Tensor, kv_buf=None, attention_kernel: bool = False):
        """``kv_buf``: the expert's cached keys/values with room for its own (None: the encoder's self-attention);
        ``attention_kernel``: the expert's attention through :func:`~rollcap.kernels.attention.expert_attention`'s
        kernel where it runs (else its reference, this block's arithmetic without it)."""
        o = attend(self.qkv(y), self.heads, mask, kv_buf, attention_kernel)
        fp8 = isinstance(self.fc1, Fp8Linear)
        x, y = add_layernorm(x, self.out(o), self.eps2, FP8 if fp8 else None)
        if fp8:  # fc1 at float8, then GELU and the row-wise quantisation fc2 reads in one pass
            return x, self.fc2(
                gelu_quantize_rows_fp8(self.fc1(y))
                if isinstance(self.fc2, Fp8Linear)
                else F.gelu(self.fc1(y), approximate="tanh")
            )
        return x, self.fc2(linear_gelu(y, self.fc1.weight, self.fc1.bias))


def run_blocks(
    blocks, x: torch.Tensor, mask: torch.Tensor, kv=None, inputs: list | None = None, attention_kernel=False
):
    """``x`` through lean ``blocks``; returns the last block's residual and its pending MLP output.

    ``inputs``: appended each block's ``(input, normalised input)``; ``attention_kernel``: as :meth:`LeanBlock.forward`.
    """
    d = None
    for i, blk in enumerate(blocks):
        x, y = add_layernorm(x, d, blk.eps1, blk.in_dtype)
        if inputs is not None:
            inputs.append((x, y))
        x, d = blk(x, y, mask, kv[i] if kv is not None else None, attention_kernel)
    return x, d


class LeanExpert(FusedExpert):
    """The fused expert with lean blocks; built from a :class:`FusedExpert` (its tensors are shared, not copied)."""

    CAST_PARAMS = ("prefix_w", "prefix_b", "in_w")
    """Matmul parameters that are not ``nn.Linear`` weights, stored in the compute dtype with the linears'."""

    def __init__(self, fused: FusedExpert, attention_kernel: bool = False, step_kernel: bool = False):  # noqa: D107 - the parent's state is taken over
        nn.Module.__init__(self)
        self.attention_kernel, self.step_kernel = attention_kernel, step_kernel
        self._stacked: tuple[tuple, dict] | None = None
        self.blocks = nn.ModuleList(LeanBlock(b) for b in fused.blocks)
        self.prefix_w, self.prefix_b, self.in_w = fused.prefix_w, fused.prefix_b, fused.in_w
        for name in ("step_bias", "base", "time_emb"):
            self.register_buffer(name, getattr(fused, name))
        self.prefix_eps, self.out, self.out_eps, self.width = fused.prefix_eps, fused.out, fused.out_eps, fused.width

    def prefix_kv_normed(self, normed: list[torch.Tensor]) -> torch.Tensor:
        """As :meth:`FusedExpert.prefix_kv` from the hidden states already normalised (affine-free, ``prefix_eps``)."""
        depth = len(normed)
        b, n, w = normed[0].shape
        x = torch.stack(normed).view(depth, b * n, w)
        heads = self.blocks[0].heads
        return torch.baddbmm(self.prefix_b, x, self.prefix_w).view(depth, b, n, 2, heads, self.width // heads)

    def stacked(self) -> dict[str, torch.Tensor]:
        """The blocks' linears stacked for the step kernel (:func:`~rollcap.kernels.expert_step.stack_blocks`), made
        again when the weights were replaced (moved, cast or copied) since the last call."""
        key = tuple(
            (t.data_ptr(), t.dtype)
            for b in self.blocks
            for lin in (b.qkv, b.out, b.fc1, b.fc2)
            for t in (lin.weight, lin.bias)
        )
        if self._stacked is None or self._stacked[0] != key:
            with torch.no_grad():
                self._stacked = (key, stack_blocks(self.blocks))
        return self._stacked[1]

    def forward(self, x, step_bias, kv, mask, branches: int = 1):
        """As :meth:`FusedExpert.forward`; with ``step_kernel``, where the kernel runs, the whole step is one kernel
        (kernels/expert_step.py) and the branches' rows read ``x`` in place."""
        if self.step_kernel:
            v = expert_step(self, x, step_bias, kv, mask)
            if v is not None:
                return v
        z = F.linear(branch_rows(x, branches), self.in_w) + step_bias
        z, d = run_blocks(self.blocks, z, mask, kv, attention_kernel=self.attention_kernel)
        return self.out(add_layernorm(z, d, self.out_eps)[1])


class LeanFlowVLA(FusedFlowVLA):
    """The lean sampler (see the module docstring); the samplers are :class:`FusedFlowVLA`'s."""

    def __init__(self, plain: FlowVLA, fused_from: str = "", attention_kernel: bool = False, step_kernel: bool = False):
        super().__init__(plain, fused_from)
        self.cfg = LeanFlowVLAConfig(
            **{f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(FusedFlowVLAConfig)}
        )
        self.encoder.blocks = nn.ModuleList(LeanBlock(b) for b in self.encoder.blocks)
        self.expert = LeanExpert(self.expert, attention_kernel, step_kernel)

    def fingerprint_facts(self, device: torch.device | str) -> dict:
        """What a lean chunk's bits depend on beyond the config and weights: the fused ops' kernels."""
        e = self.expert
        return {
            **kernel_facts(device),
            **attention_facts(e.attention_kernel, device),
            **step_facts(e, device),
        }

    def guided_prefix(self, images, state, tokens, adv):
        if self.cfg.shared_prefix:
            return self._shared_prefix(images, state, tokens, adv)
        x, valid = self.encoder.embed(images, state, tokens, self.adv_emb(adv)[:, None, :])
        mask = additive_mask(valid, self.cfg.horizon)
        return with_room(self._prefix_kv(x, mask[..., : valid.shape[1]]), self.cfg.horizon), mask

    def _prefix_kv(self, x: torch.Tensor, enc_mask: torch.Tensor) -> torch.Tensor:
        """The prefix sequence ``x`` through the encoder's blocks, projected to the expert's keys/values."""
        inputs: list = []
        run_blocks(self.encoder.blocks, x, enc_mask, inputs=inputs)
        return self.expert.prefix_kv_normed(self._normed(inputs))

    def _normed(self, inputs: list) -> list[torch.Tensor]:
        """The expert's prefix norm of each block's input (``inputs``: :func:`run_blocks`'s pairs)."""
        e = self.expert
        if all(blk.eps1 == e.prefix_eps and blk.in_dtype is None for blk in self.encoder.blocks):
            return [y for _, y in inputs]  # each block's own input norm is the expert's prefix norm of that input
        return [add_layernorm(x, None, e.prefix_eps)[1] for x, _ in inputs]

    def _shared_prefix(self, images, state, tokens, adv):
        x, enc_mask, n_obs, r, mask = self.shared_inputs(images, state, tokens, adv)
        kv = split_branches(self._prefix_kv(x, enc_mask), n_obs, r, batch_dim=1)
        return with_room(kv, self.cfg.horizon), mask


def lean(
    model: FlowVLA, fused_from: str = "", attention_kernel: bool = False, step_kernel: bool = False
) -> LeanFlowVLA:
    """The lean sampler of a plain :class:`FlowVLA` (``model`` is not changed); ``fused_from`` as for :func:`fuse`.

    ``attention_kernel``: the expert's attention through one Triton kernel on CUDA
    (:mod:`rollcap.kernels.attention`; in the fingerprint); ``step_kernel``: a small expert's whole step through one
    Triton kernel on CUDA where it fits (:mod:`rollcap.kernels.expert_step`; in the fingerprint). Measurements for
    now (``kernel_sweep``'s ``-attn`` and ``-step`` settings), not runner options: their GPU times are unmeasured."""
    if not isinstance(model, FlowVLA):
        raise TypeError(f"lean: expected a FlowVLA, got {type(model).__name__}")
    outer = torch.get_num_threads()
    torch.set_num_threads(1)  # the folds' bits depend on the thread count (see fuse)
    try:
        with torch.no_grad():
            return LeanFlowVLA(model, fused_from, attention_kernel, step_kernel).eval()
    finally:
        torch.set_num_threads(outer)
