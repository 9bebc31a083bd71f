"""How LeRobot features meet rollcap observations: the feature map, instruction vectors, noise shapes and the
lazy import of LeRobot itself (:class:`~rollcap.policies.lerobot.LeRobotPolicy` uses these; so does the LeRobot
exporter). Imports point downward: ``kernels`` only; LeRobot is imported lazily."""

from __future__ import annotations

from __future__ import annotations
import hashlib
import sys
from collections.abc import Mapping
from typing import Any
import numpy as np
import torch


INSTALL_HINT = (
    "build LeRobot's venv with `bash scripts/lerobot_env.sh` (lerobot==0.6.1 needs Python >= 3.12) and run there"
)
STATE_KEYS = ("state", "proprio", "observation.state")
"""rollcap observation keys tried, in order, for LeRobot's ``observation.state``."""
_NOT_BITS = frozenset(
    {
        "device",
        "pretrained_path",
        "pretrained_backbone_weights",
        "push_to_hub",
        "repo_id",
        "private",
        "tags",
        "license",
        "use_amp",
    }
)
"""Config fields that do not change a chunk's bits (where it came from or is published; the device is in the fingerprint already)."""


BACKENDS = ("eager", "jit", "cuda")
"""What runs ``predict_action_chunk``: eager, a ``torch.jit.trace`` plan (CPU), a CUDA graph (CUDA)."""
NOISE = "noise"
"""The noise buffer's name (a feature is named ``observation.*``)."""

INSTRUCTION_FEATURE = "observation.environment_state"
"""Where an exported instruction goes for policies without a language input (ACT and Diffusion Policy read this feature)."""
INSTRUCTION = "instruction"


def instruction_vector(text: str, dims: int) -> np.ndarray:
    """A float32 ``[dims]`` hashed bag of words of ``text`` (word -> sha256 bucket, counted).

    The instruction as a vector for policies that read no language (ACT,
    Diffusion Policy): ``export_lerobot(..., instruction_dims=N)`` writes it as
    :data:`INSTRUCTION_FEATURE`, and :class:`LeRobotPolicy` computes the same
    from each observation's instruction. The built-in task's 9 instructions
    give 9 different vectors at 16, 24, 32 and 64 dims.
    """
    if not isinstance(dims, int) or isinstance(dims, bool) or dims < 1:
        raise ValueError(f"instruction_dims: expected an integer >= 1, got {dims!r}")
    out = np.zeros(dims, np.float32)
    for word in str(text).lower().split():
        out[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little") % dims] += 1.0
    return out


def quiet_import_logs() -> None:
    """Keep lerobot's import-time noise off the terminal (a multi-page torchcodec traceback when FFmpeg is absent; it falls
    back to pyav, and rollcap decodes no video) and the datasets library's per-episode progress bars."""
    import logging
    import os

    logging.getLogger("lerobot.utils.import_utils").setLevel(logging.ERROR)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def require_lerobot():
    """Import and return the ``lerobot`` package, or raise ImportError saying how to get it."""
    quiet_import_logs()
    try:
        import lerobot
    except ImportError as err:
        raise ImportError(
            f"lerobot is not importable in this Python ({sys.version.split()[0]}); {INSTALL_HINT}"
        ) from err
    return lerobot


def map_features(features: Mapping[str, Any], obs_keys, keys: Mapping[str, str] | None = None) -> dict[str, str]:
    """LeRobot input feature -> rollcap observation key.

    Defaults: ``observation.state`` <- ``state`` (or ``proprio``);
    ``observation.images.X`` <- ``image_X`` (or ``X``); ``observation.image``
    <- the one ``image_*`` key; ``observation.Y`` <- ``Y``;
    :data:`INSTRUCTION_FEATURE` <- ``environment_state``, else the instruction
    (as :func:`instruction_vector`). ``keys`` overrides any of them.

    Raises:
        ValueError: one line naming the feature that has no key.
    """
    has_instruction = INSTRUCTION in obs_keys
    obs_keys = [k for k in obs_keys if k != INSTRUCTION] + ([INSTRUCTION] if has_instruction else [])
    keys = dict(keys or {})
    unknown = sorted(set(keys) - set(features))
    if unknown:
        raise ValueError(f"keys: {unknown[0]!r} is not an input feature of the policy (it has {sorted(features)})")
    images = [k for k in obs_keys if k.startswith("image_")]
    out = {}
    for name, feat in features.items():
        short = name.removeprefix("observation.")
        if name in keys:
            tried = [keys[name]]
        elif name == "observation.state":
            tried = list(STATE_KEYS)
        elif short.startswith("images."):
            cam = short.removeprefix("images.")
            tried = [f"image_{cam}", cam, name]
        elif name == "observation.image":
            tried = images if len(images) == 1 else ["image", name]
        else:
            tried = [short, name] + ([INSTRUCTION] if name == INSTRUCTION_FEATURE else [])
        found = next((k for k in tried if k in obs_keys), None)
        if found is None:
            shape = tuple(getattr(feat, "shape", ()) or ())
            raise ValueError(
                f"LeRobot input feature {name!r} {shape} has no rollcap observation key (tried {tried}; the observation has {sorted(obs_keys)}); pass keys={{{name!r}: '<observation key>'}}"
            )
        out[name] = found
    return out


def _to_feature(name: str, feat, value) -> torch.Tensor:
    """One observation value as the unbatched tensor LeRobot's env processing makes (images: CHW float in [0, 1])."""
    a = np.asarray(value)
    want = tuple(getattr(feat, "shape", ()) or ())
    visual = str(getattr(getattr(feat, "type", None), "name", "")) == "VISUAL"
    if visual:
        if a.ndim != 3 or a.dtype != np.uint8:
            raise ValueError(f"LeRobot input feature {name!r}: expected a uint8 HxWxC image, got {a.dtype} {a.shape}")
        t = torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))).to(torch.float32).div_(255.0)
    else:
        t = torch.from_numpy(np.array(a, dtype=np.float32, copy=True))
    if want and tuple(t.shape) != want:
        raise ValueError(
            f"LeRobot input feature {name!r}: expected shape {want}, the observation gives {tuple(t.shape)}"
        )
    return t


def _noise_shape(cfg, action_dim: int) -> tuple[int, int]:
    """The shape of one sample of the policy's own noise (no batch dim)."""
    if getattr(cfg, "type", "") == "diffusion":
        return (int(cfg.horizon), action_dim)
    if hasattr(cfg, "max_action_dim") and hasattr(cfg, "chunk_size"):  # pi0 / pi05 / SmolVLA pad actions
        return (int(cfg.chunk_size), int(cfg.max_action_dim))
    return (int(cfg.chunk_size), action_dim)


def _seed_of(noise: np.ndarray) -> int:
    return int.from_bytes(hashlib.sha256(noise.tobytes()).digest()[:8], "little") & (2**63 - 1)
