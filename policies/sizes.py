"""Named FlowVLA sizes from the shipped policy up to pi0 scale, built with random weights, and their weight-traffic floor.

A size is a frozen :class:`~rollcap.policies.flow_vla.FlowVLAConfig` looked up by name (:func:`size_config`, with a
nearest-match suggestion) or read from a JSON file (a config object, or a checkpoint's ``.json`` with its
``config``). :func:`build` makes the module on any device; on ``meta`` nothing is allocated, which is how the
tests check the parameter counts of the billion-parameter sizes.

The floor (:func:`weight_floor`) is the time to read the weights once per use from device memory: the prefix
(encoder and the per-layer key/value projections of the prefix) once per chunk, the action expert's per-step
weights once per Euler step, ``K`` steps. Activations (the prefix keys/values the expert reads each step, a few
per cent of the weights at these sizes) are not counted, so the real floor is a little higher.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path

import torch

from rollcap.kernels.checkpoint import on_meta
from rollcap.policies.flow_vla import FlowVLA, FlowVLAConfig

_SHIPPED = FlowVLAConfig(state_dim=28, state_group=4, width=128, depth=3, heads=4, horizon=8, action_dim=2)
"""The shipped PushBlock policy's shape (``policies/weights/pushblock_policy.json``; a test checks they agree)."""

_PI0_CAMERAS = ("image_front", "image_wrist")
_PI0_IO = {
    "image_keys": _PI0_CAMERAS,
    "image_size": 224,
    "patch_size": 14,
    "state_dim": 14,
    "state_group": 0,
    "action_dim": 14,
    "horizon": 50,
    "num_steps": 10,
}

SIZES: dict[str, FlowVLAConfig] = {
    "shipped": _SHIPPED,
    "26m": dataclasses.replace(_SHIPPED, width=512, depth=6, heads=8),
    "205m": dataclasses.replace(_SHIPPED, width=1024, depth=12, heads=16, horizon=50, patch_size=8),
    "300m": FlowVLAConfig(**_PI0_IO, width=1024, depth=18, heads=16),
    "3b": FlowVLAConfig(**_PI0_IO, width=2560, expert_width=1024, depth=18, heads=16, mlp_ratio=8),
}
"""The named sizes. ``shipped``, ``26m`` and ``205m`` are the rows of issue 33's table (one 64 px camera, 8 or 50
actions); ``300m`` and ``3b`` are pi0-shaped: two 224 px cameras in 14 px patches, 14-dim state and actions,
50-action chunks, 10 Euler steps; ``3b`` has a 2560-wide prefix with an 8x MLP and a 1024-wide action expert
(pi0: a 2048-wide PaliGemma beside a 1024-wide expert, 18 layers each)."""

SMALL = ("shipped", "26m")
"""The sizes ``rollcap bench`` runs by default on CPU (the others need GBs and seconds per chunk there)."""

HBM_BYTES_PER_S = {"H100 SXM": 3.35e12, "H200": 4.8e12}
"""Peak memory bandwidth of the GPUs the floor is stated for (vendor figures)."""

BF16_DENSE_FLOPS = {"H100 SXM": 989e12, "H200": 989e12}
"""Peak dense bf16 tensor-core rate of the same GPUs (vendor figures, FLOP/s)."""

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp8": 2}
"""Bytes per weight read at each precision (``bf16``: weights held in bf16; autocast over fp32 weights reads more;
``fp8``: the prefix in bf16, the expert's per-step weights at :data:`FP8_STEP_BYTES`)."""
FP8_STEP_BYTES = 1
"""Bytes per expert-step weight at ``fp8`` (the expert blocks' linears in float8; the rest of a step is a few per cent)."""


def size_config(name: str) -> FlowVLAConfig:
    """The config of a named size, or of a JSON file (a config object or a checkpoint ``.json``).

    Raises:
        ValueError: an unknown name (with the nearest one) or a bad file, in one line naming ``--policy-size``.
    """
    if name in SIZES:
        return SIZES[name]
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"--policy-size: cannot read {path}: {err}") from err
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = data["config"]
        return FlowVLAConfig.from_json(data, where=f"--policy-size {path}")
    near = difflib.get_close_matches(name.lower(), list(SIZES), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"--policy-size: unknown size {name!r} (sizes: {', '.join(SIZES)}, or a config .json){hint}")


def build(cfg: FlowVLAConfig, device: str | torch.device = "cpu", seed: int = 0) -> FlowVLA:
    """A :class:`FlowVLA` of ``cfg`` with random weights, made on ``device`` (``meta``: shapes only, no memory)."""
    device = torch.device(device)
    if device.type == "meta":
        return on_meta(FlowVLA, cfg).eval()
    torch.manual_seed(seed)  # the bench's weights are random; this only makes two runs build the same ones
    with device:
        return FlowVLA(cfg).eval()


def param_counts(model: FlowVLA) -> dict[str, int]:
    """``total``, ``prefix`` (read once per chunk) and ``expert_step`` (read at every Euler step) parameters."""
    total = sum(p.numel() for p in model.parameters())
    step = 0
    for name, p in model.expert.named_parameters():
        if not name.startswith(("prefix_ln.", "prefix_proj.")):
            step += p.numel()
    prefix = total - step
    if not hasattr(model.expert, "prefix_proj"):  # the blocks' kv projection serves the prefix (once) and each step
        prefix += sum(blk.attn.kv.weight.numel() + blk.attn.kv.bias.numel() for blk in model.expert.blocks)
    return {"total": total, "prefix": prefix, "expert_step": step}


def weight_floor(cfg: FlowVLAConfig, precision: str = "bf16", bandwidth: float = HBM_BYTES_PER_S["H200"]) -> dict:
    """Bytes of weights one chunk reads and the time that takes at ``bandwidth`` bytes/s (built on ``meta``)."""
    counts = param_counts(build(cfg, "meta"))
    per = DTYPE_BYTES[precision]
    step_bytes = counts["expert_step"] * (FP8_STEP_BYTES if precision == "fp8" else per)
    chunk_bytes = counts["prefix"] * per + cfg.num_steps * step_bytes
    return {
        **counts,
        "bytes_per_step": step_bytes,
        "bytes_per_chunk": chunk_bytes,
        "sampler_floor_ms": cfg.num_steps * step_bytes / bandwidth * 1e3,
        "chunk_floor_ms": chunk_bytes / bandwidth * 1e3,
    }


def chunk_flops(cfg: FlowVLAConfig) -> dict[str, float]:
    """Floating-point operations of one guided batch-1 chunk: ``prefix`` (the encoder's blocks and the expert's
    prefix keys/values, both guidance branches), ``expert`` (``K`` steps of both branches' ``H`` action tokens),
    ``total``, and ``attention`` (the part of ``total`` in attention's two products). Matmuls count 2 per
    multiply-add; the other embeddings, the flow-time MLP, norms and elementwise work are left out (0.25% at ``26m``).

    Without ``shared_prefix`` every prefix token runs once per branch; with it one sequence holds the observation's
    tokens once and the advantage token of each branch (its attention over the whole sequence, masked).
    """
    w, we, r, depth = cfg.width, cfg.expert_width or cfg.width, cfg.mlp_ratio, cfg.depth
    n_img = len(cfg.image_keys) * (cfg.image_size // cfg.patch_size) ** 2
    n_obs = n_img + cfg.max_tokens + (cfg.state_dim // cfg.state_group if cfg.state_group else 1)
    patches = n_img * cfg.patch_size**2 * 3 * w  # the patch projection's multiply-adds, per branch
    n, h = n_obs + 1, cfg.horizon  # the advantage token last
    block, kv = (4 + 2 * r) * w * w, w * 2 * we  # multiply-adds per token: a block's linears; the expert's prefix k/v
    if cfg.shared_prefix:  # one sequence: the observation, then both branches' indicators (attention masked, not cut)
        lin, att = (n_obs + 2) * (block + kv), (n_obs + 2) * 2 * (n_obs + 2) * w
    else:
        lin, att, patches = 2 * n * (block + kv), 2 * n * 2 * n * w, 2 * patches
    step_lin = 2 * h * ((4 + 2 * r) * we * we * depth + 2 * cfg.action_dim * we)
    step_att = 2 * h * 2 * (n + h) * we * depth
    macs = {"prefix": (lin + att) * depth + patches, "expert": cfg.num_steps * (step_lin + step_att)}
    out = {k: 2.0 * v for k, v in macs.items()}
    return {**out, "total": out["prefix"] + out["expert"], "attention": 2.0 * (att * depth + cfg.num_steps * step_att)}


def roofline_ms(cfg: FlowVLAConfig, gpu: str = "H100 SXM") -> dict[str, float]:
    """A bf16 chunk's lower bound on ``gpu``: the prefix and the expert's steps, each at the slower of its weight
    traffic (:func:`weight_floor`) and its tensor-core work at the peak rate (:func:`chunk_flops`), summed; and each.

    Arithmetic from vendor peaks, not a measurement: no kernel reaches either peak, and activations are not counted.
    """
    bw, peak = HBM_BYTES_PER_S[gpu], BF16_DENSE_FLOPS[gpu]
    floor, flops = weight_floor(cfg, "bf16", bw), chunk_flops(cfg)
    prefix = max(flops["prefix"] / peak, floor["prefix"] * DTYPE_BYTES["bf16"] / bw)
    expert = max(flops["expert"] / peak, floor["sampler_floor_ms"] / 1e3)
    return {"prefix": prefix * 1e3, "expert": expert * 1e3, "chunk": (prefix + expert) * 1e3}


def chunk_bounds(cfg: FlowVLAConfig, device: torch.device | str, precisions=("bf16",)) -> dict:
    """What bounds a chunk of ``cfg``: ``gflop`` (:func:`chunk_flops`); on a GPU this module knows, also ``gpu``,
    ``floor_ms`` per precision (:func:`weight_floor`) and the bf16 ``roofline_ms`` (:func:`roofline_ms`)."""
    out: dict = {"gflop": chunk_flops(cfg)["total"] / 1e9}
    bw = device_bandwidth(device)
    if bw is not None:
        out["gpu"] = bw[0]
        out["floor_ms"] = {p: weight_floor(cfg, p, bw[1])["chunk_floor_ms"] for p in precisions}
        out["roofline_ms"] = roofline_ms(cfg, bw[0])["chunk"]
    return out


def device_bandwidth(device: torch.device | str) -> tuple[str, float] | None:
    """``(name, bytes/s)`` of a CUDA device this module knows (H100 SXM, H200), else None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H200" in name:
        return "H200", HBM_BYTES_PER_S["H200"]
    if "H100" in name and "PCIe" not in name:
        return "H100 SXM", HBM_BYTES_PER_S["H100 SXM"]
    return None
