"""Weights as safetensors plus a JSON config; loads refuse mismatches by name.

No pickle: tensors go through ``safetensors``, the config is JSON. The JSON
holds ``kind``, ``config``, ``format``, ``weights_digest`` (over the tensors'
names, dtypes, shapes and bytes) and ``meta_digest`` (over the JSON's other
fields), so a changed byte in either file is refused on load. Checkpoints
written before ``meta_digest`` existed still load; their weights are checked
against ``weights_digest``, their config only by validation.

A load checks, in order and before allocating anything the files do not
hold: the JSON (size, fields, digest), the config (each field by name), the
tensor layout the config describes (built on the ``meta`` device) against the
safetensors header, then the weights' bytes against ``weights_digest``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.overrides import TorchFunctionMode

from rollcap.kernels.errors import CheckpointMismatch
from rollcap.kernels.files import atomic_write, canonical_json, sealed_digest
from rollcap.kernels.fingerprint import tensor_digest

FORMAT = 1
_FIELDS = {"kind", "config", "format", "weights_digest", "meta_digest"}
_MAX_JSON_BYTES = 1 << 24
"""A checkpoint's JSON is a config, not data: anything larger is refused unread."""
_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _meta_digest(meta: dict) -> str:
    """sha256 over the canonical JSON of every field but ``meta_digest``."""
    return sealed_digest(meta, "meta_digest")


def save_checkpoint(module: torch.nn.Module, config: dict, path: str | Path, kind: str) -> Path:
    """Write ``<path>.safetensors`` and ``<path>.json`` atomically; returns the json path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    meta = {"kind": kind, "config": config, "weights_digest": tensor_digest(tensors), "format": FORMAT}
    meta["meta_digest"] = _meta_digest(meta)
    st, js = path.with_suffix(".safetensors"), path.with_suffix(".json")
    text = canonical_json(meta, indent=2)
    # 0o644 whatever the umask: checkpoints are shared read-only data
    atomic_write(st, lambda p: save_file(tensors, p), mode=0o644)
    atomic_write(js, lambda p: Path(p).write_text(text, encoding="utf-8"), mode=0o644)
    return js


def read_checkpoint_meta(path: str | Path, kind: str) -> dict:
    """Read and check the JSON side of a checkpoint (``.json`` or ``.safetensors`` path).

    Raises:
        CheckpointMismatch: missing, too large, not JSON, another kind or
            format, a field missing, unknown or of the wrong type, or a
            ``meta_digest`` that does not match (one line naming the file).
    """
    js = Path(path).with_suffix(".json")
    if not js.is_file():
        raise CheckpointMismatch(f"{js}: checkpoint config not found")
    size = js.stat().st_size
    if size > _MAX_JSON_BYTES:
        raise CheckpointMismatch(
            f"{js}: {size} bytes; a checkpoint config is at most {_MAX_JSON_BYTES}, is this the right file?"
        )
    try:
        meta = json.loads(js.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointMismatch(
            f"{js}: not valid JSON ({getattr(err, 'msg', None) or type(err).__name__}); the file is damaged"
        ) from err
    if not isinstance(meta, dict) or meta.get("kind") != kind or not isinstance(meta.get("config"), dict):
        got = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointMismatch(f"{js}: expected a {kind!r} checkpoint, got {got!r}")
    unknown = sorted(set(meta) - _FIELDS)
    if unknown:
        raise CheckpointMismatch(f"{js}: unknown fields {unknown}; the file is damaged or from a newer rollcap")
    if meta.get("format") != FORMAT:
        raise CheckpointMismatch(f"{js}: checkpoint format {meta.get('format')!r}, this rollcap reads format {FORMAT}")
    if not isinstance(meta.get("weights_digest"), str):
        raise CheckpointMismatch(f"{js}: no weights_digest string; the file is damaged, save the checkpoint again")
    if "meta_digest" in meta and meta["meta_digest"] != _meta_digest(meta):
        raise CheckpointMismatch(
            f"{js}: meta_digest does not match the file's fields; the file was edited or damaged, save the checkpoint again"
        )
    return meta


def _header(st: Path) -> dict[str, tuple[torch.dtype | str, tuple[int, ...]]]:
    """name -> (dtype, shape) from a safetensors header; no tensor bytes are read."""
    if not st.is_file():
        raise CheckpointMismatch(f"{st}: weights file not found")
    try:
        with safe_open(str(st), framework="pt") as f:
            out = {}
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (_ST_DTYPES.get(s.get_dtype(), s.get_dtype()), tuple(s.get_shape()))
            return out
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointMismatch(f"{st}: unreadable safetensors ({err})") from err


def _check_layout(st: Path, want: dict[str, torch.Tensor], have: dict) -> None:
    """Refuse, naming the first difference, unless ``have`` (a header) holds exactly ``want``'s names, dtypes and shapes."""
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing or extra:
        raise CheckpointMismatch(
            f"{st}: tensors do not match the config: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for k, v in want.items():
        dtype, shape = have[k]
        if shape != tuple(v.shape) or dtype != v.dtype:
            raise CheckpointMismatch(
                f"{st}: tensor {k!r} is {shape} {dtype}, the config needs {tuple(v.shape)} {v.dtype}"
            )


def load_weights(module: torch.nn.Module, path: str | Path, expect_digest: str | None = None) -> str:
    """Load safetensors weights into ``module``, naming any missing/extra/mis-shaped tensor.

    Args:
        module: receives the weights (untouched if anything mismatches).
        path: the checkpoint (``.safetensors`` or ``.json`` path).
        expect_digest: the ``weights_digest`` the bytes must have.

    Returns:
        The weights digest.
    """
    st = Path(path).with_suffix(".safetensors")
    own = module.state_dict()
    _check_layout(st, own, _header(st))
    try:
        tensors = load_file(str(st))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointMismatch(f"{st}: unreadable safetensors ({err})") from err
    digest = tensor_digest(tensors)
    if expect_digest is not None and digest != expect_digest:
        raise CheckpointMismatch(
            f"{st}: weights digest {digest} differs from the config's weights_digest {expect_digest}; "
            "the weights were damaged or replaced, save the checkpoint again"
        )
    module.load_state_dict(tensors, strict=True)
    return digest


class _NoInit(TorchFunctionMode):
    """Skips ``torch.nn.init``'s in-place initialisers: on the ``meta`` device they fill nothing, and torch's meta
    ``normal_`` (embeddings, position tables) imports ``torch._dynamo`` on its first call, a second of start-up
    for every process that loads a checkpoint."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        in_place_init = getattr(func, "__module__", None) == "torch.nn.init" and func.__name__.endswith("_")
        if in_place_init:  # normal_, kaiming_uniform_, ...: the tensor, unfilled
            return args[0] if args else next(iter((kwargs or {}).values()))
        return func(*args, **(kwargs or {}))


def on_meta(build, *args):
    """``build(*args)`` on the ``meta`` device: shapes and dtypes only, no memory and no initialisers run."""
    with torch.device("meta"), _NoInit():
        return build(*args)


def load_module(path: str | Path, kind: str, config_from_json, build) -> torch.nn.Module:
    """Read a checkpoint's config, build the module, load and verify its weights; eval mode.

    ``config_from_json(data, where)`` parses the config (raising ``ValueError``
    naming ``where`` and the field); ``build(config)`` makes the module. The
    module is built for real only once the layout it would have, built on the
    ``meta`` device, matches the weights file's header, so a config describing
    more than the file holds allocates nothing.
    """
    meta = read_checkpoint_meta(path, kind)
    js, st = Path(path).with_suffix(".json"), Path(path).with_suffix(".safetensors")
    try:
        cfg = config_from_json(meta["config"], str(js))
    except (TypeError, ValueError) as err:
        raise CheckpointMismatch(str(err)) from err
    have = _header(st)
    try:
        layout = on_meta(build, cfg).state_dict()
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckpointMismatch(f"{js}: the config does not describe a buildable {kind} ({err})") from err
    _check_layout(
        st, layout, have
    )  # the header matches the file's size (safetensors checks), so the build below is bounded by it
    module = build(cfg)
    load_weights(module, st, expect_digest=meta["weights_digest"])
    return module.eval()
