"""Observations as the models see them, and a byte-level tokenizer.

An observation is a mapping with ``"state"`` (float32 vector), one uint8
``(H, W, 3)`` image per camera key (e.g. ``"image_front"``) and
``"instruction"`` (str). :class:`ObsSpec` turns it into the exact tensors the
static buffers hold, validating everything and never truncating or
broadcasting.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.errors import BadInput
from rollcap.kernels.fingerprint import tensor_digest
from rollcap.kernels.fp8 import fp8_facts, to_fp8
from rollcap.kernels.precision import cast_linears, check_precision
from rollcap.kernels.runner import GraphRunner

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259


def tokenize(text: str, max_tokens: int) -> np.ndarray:
    """UTF-8 bytes framed by BOS/EOS, right-padded with PAD to ``max_tokens``.

    Raises :class:`BadInput` if the instruction does not fit: it is never
    silently truncated.
    """
    if not isinstance(text, str):
        raise BadInput(f"instruction: expected str, got {type(text).__name__}")
    raw = list(text.encode("utf-8"))
    need = len(raw) + 2
    if need > max_tokens:
        raise BadInput(
            f"instruction: {len(raw)} bytes needs {need} tokens, the model's budget is {max_tokens} "
            f"(shorten it or use a model with a larger max_tokens): {text[:40]!r}"
        )
    out = np.full((max_tokens,), PAD, dtype=np.int64)
    out[0] = BOS
    out[1 : 1 + len(raw)] = raw
    out[1 + len(raw)] = EOS
    return out


@dataclass(frozen=True)
class ObsSpec:
    """What a model reads from an observation."""

    image_keys: tuple[str, ...]
    image_size: int
    state_dim: int
    max_tokens: int

    def buffer_shapes(self, batch: int = 1) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Buffer name -> (shape, dtype) for ``batch`` observations (one row each)."""
        shapes = {k: ((batch, self.image_size, self.image_size, 3), torch.uint8) for k in self.image_keys}
        shapes["state"] = ((batch, self.state_dim), torch.float32)
        shapes["tokens"] = ((batch, self.max_tokens), torch.int64)
        return shapes

    def to_inputs(
        self, obs: Mapping[str, object], token_cache: dict[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Validate one observation and return batch-1 arrays keyed by buffer name."""
        if not isinstance(obs, Mapping):
            raise BadInput(f"observation: expected a mapping, got {type(obs).__name__}")
        missing = [k for k in (*self.image_keys, "state", "instruction") if k not in obs]
        if missing:
            raise BadInput(f"observation: missing {missing}; have {sorted(obs)}")
        out: dict[str, np.ndarray] = {}
        for k in self.image_keys:
            img = np.asarray(obs[k])
            want = (self.image_size, self.image_size, 3)
            if img.shape != want or img.dtype != np.uint8:
                raise BadInput(f"observation[{k!r}]: expected uint8 {want}, got {img.dtype} {img.shape}")
            out[k] = img[None]
        state = np.asarray(obs["state"])
        if state.shape != (self.state_dim,) or state.dtype != np.float32:
            raise BadInput(
                f"observation['state']: expected float32 ({self.state_dim},), got {state.dtype} {state.shape}"
            )
        if not np.isfinite(state).all():
            raise BadInput("observation['state']: contains NaN or Inf")
        out["state"] = state[None]
        text = obs["instruction"]
        if token_cache is not None and isinstance(text, str) and text in token_cache:
            toks = token_cache[text]
        else:
            toks = tokenize(text, self.max_tokens)
            if token_cache is not None:
                token_cache[text] = toks
        out["tokens"] = toks[None]
        return out


class ObsModelConfig:
    """Mixin for model configs that read observations (``image_keys``, ``image_size``,
    ``state_dim``, ``max_tokens``): the obs spec and JSON round trip, checked by field name.

    Every size is bounded (:data:`LIMITS`), so a damaged or hostile config
    (``depth: 10**12``) is refused by field name before a module is built;
    whether the weights hold what the config describes is the checkpoint
    loader's check.
    """

    LIMITS = {"image_size": 4096, "state_dim": 65536, "max_tokens": 65536, "width": 65536, "depth": 256, "cameras": 16}
    """Upper bounds of the shared fields (``cameras``: the number of ``image_keys``)."""
    RESERVED_KEYS = ("state", "tokens", "instruction", "noise")
    """Input names image keys may not take."""

    @property
    def obs_spec(self) -> ObsSpec:
        return ObsSpec(self.image_keys, self.image_size, self.state_dim, self.max_tokens)

    def _fail(self, name: str, expected: str) -> ValueError:
        return ValueError(f"{type(self).__name__}.{name}: expected {expected}, got {getattr(self, name)!r}")

    def _require_int(self, name: str, lo: int = 1, hi: int | None = None) -> None:
        v = getattr(self, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            raise self._fail(name, f"an int in {lo}..{hi}" if hi is not None else f"an int >= {lo}")

    def _require_number(self, name: str) -> None:
        v = getattr(self, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise self._fail(name, "a finite number")

    def _check_obs_fields(self) -> None:
        """Validate the fields every observation model has (call first in ``__post_init__``)."""
        keys = self.image_keys
        if (
            not isinstance(keys, tuple)
            or len(keys) > self.LIMITS["cameras"]
            or len(set(keys)) != len(keys)
            or not all(isinstance(k, str) and k and k not in self.RESERVED_KEYS for k in keys)
        ):
            raise self._fail(
                "image_keys",
                f"up to {self.LIMITS['cameras']} distinct non-empty names other than {list(self.RESERVED_KEYS)}",
            )
        for name in ("image_size", "state_dim", "max_tokens", "width", "depth"):
            self._require_int(name, 1, self.LIMITS[name])
        self._require_int("patch_size", 1, self.image_size)
        if self.image_size % self.patch_size:
            raise self._fail("patch_size", f"a divisor of image_size {self.image_size}")
        self._require_int("heads", 1, self.width)
        if self.width % self.heads:
            raise self._fail("heads", f"a divisor of width {self.width}")
        self._require_int("state_group", 0, self.state_dim)
        if self.state_group and self.state_dim % self.state_group:
            raise self._fail("state_group", f"0 or a divisor of state_dim {self.state_dim}")
        if self.max_tokens < 3:
            raise self._fail("max_tokens", "at least 3 (BOS, a byte, EOS)")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["image_keys"] = list(self.image_keys)
        return d

    @classmethod
    def from_json(cls, data: dict, where: str = ""):
        """Build from a JSON object; ``where`` (e.g. the file) prefixes every message.

        Raises:
            ValueError: not an object, an unknown field, or a field of a bad value (named).
        """
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown config fields {unknown}")
        data = dict(data)
        if isinstance(data.get("image_keys"), list):
            data["image_keys"] = tuple(data["image_keys"])
        try:
            return cls(**data)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from err


class ObsRunner(GraphRunner):
    """A :class:`GraphRunner` whose inputs are one observation (plus ``extra_inputs``).

    Freezes ``model`` on ``device``, builds the observation buffers from its
    config's :class:`ObsSpec`, caches instruction tokens per string, and
    fingerprints the weights. Subclasses give the graph function, the extra
    input and the output buffers, and a label.

    ``batch`` > 1: every buffer holds ``batch`` rows (one observation each) and
    one replay computes them all; :meth:`write_row` fills one row, and the
    fingerprint names the batch (a row's bits may depend on it). Batch 1 is
    the plain runner (its fingerprint has no ``batch`` field).
    """

    label = "model"
    kind = "rollcap.model"

    def __init__(
        self,
        model: torch.nn.Module,
        extra_inputs: list[BufferSpec],
        outputs: list[BufferSpec],
        device="cpu",
        backend=None,
        lane=None,
        threads: int = 1,
        batch: int = 1,
        precision: str = "fp32",
    ):
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch: expected an int >= 1, got {batch!r}")
        self.batch = batch
        self.model = model.to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.cfg = model.cfg
        self.spec = self.cfg.obs_spec
        self._tokens: dict[str, np.ndarray] = {}
        ins = [BufferSpec(k, s, d) for k, (s, d) in self.spec.buffer_shapes(batch).items()] + extra_inputs
        digest = getattr(self.model, "weights_digest", None) or tensor_digest(dict(self.model.state_dict()))
        try:  # before any conversion: fp8 where there are no float8 tensor cores is refused here
            check_precision(precision, device)
        except ValueError as err:
            raise ValueError(f"{self.label}: {err}") from None
        if precision == "fp8":  # bf16 weights, then the FP8_SCOPE linears at float8 (a copy; the caller's is untouched)
            self.model = to_fp8(cast_linears(self.model))
            self.model.weights_digest = digest
        elif (
            precision == "bf16"
            and torch.device(device).type == "cuda"
            and any(
                p.dtype != torch.bfloat16
                for m in self.model.modules()
                for p in ([m.weight] if isinstance(m, torch.nn.Linear) else [])
                + [getattr(m, n) for n in getattr(type(m), "CAST_PARAMS", ())]
            )
        ):
            # On CUDA: the same bits as autocast's per-call weight casts, without them (a CPU jit plan is traced in fp32
            # and replayed under autocast, so its weights stay fp32 there).
            self.model = cast_linears(self.model)
            self.model.weights_digest = digest  # the checkpoint's weights, as every fingerprint names them
        super().__init__(
            self._graph_fn, ins, outputs, device, backend, [self.model], lane, self.label, digest, threads, precision
        )

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # pragma: no cover - interface
        raise NotImplementedError

    def reset(self) -> None:
        """Called when an episode starts: wait out (and discard) a replay an error left in flight."""
        self.drain()

    def obs_inputs(self, obs: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Validate one observation into batch-1 arrays for the buffers."""
        return self.spec.to_inputs(obs, self._tokens)

    def write_row(self, row: int, values: Mapping[str, np.ndarray]) -> None:
        """Copy one row's validated batch-1 arrays (``obs_inputs`` and the extra inputs) into row ``row`` (nothing launched)."""
        self._require_idle("inputs written")
        for name, v in values.items():
            self.inputs.write_row(name, row, v[0])

    def load_weights(self, weights, digest: str | None = None) -> str:
        """:meth:`GraphRunner.load_weights`: a checkpoint's weights (the state dict of a model of this config) copied
        into the captured graph's in place; refused where the graph's weights are not the checkpoint's tensors (the
        fused and lean samplers re-parameterise them, fp8 stores them scaled)."""
        variant = self.cfg.to_json().get("variant")
        if variant is not None or self.precision == "fp8":
            raise BadInput(
                f"{self.label}: the {variant or 'fp8'} graph holds re-parameterised weights; new weights need the plain or sde sampler at fp32, tf32 or bf16"
            )
        return super().load_weights(weights, digest)

    def _make_fingerprint(self) -> dict:
        fp = super()._make_fingerprint()
        fp["model"] = self.kind
        fp["config"] = self.cfg.to_json()
        fp["dtype"] = "float32"
        if self.precision == "fp8":
            fp.update(fp8_facts(self.model))
        facts = getattr(self.model, "fingerprint_facts", None)
        if facts is not None:  # a sampler whose bits depend on its kernels (the lean one's fused ops)
            fp.update(facts(self.device))
        if self.batch != 1:
            fp["batch"] = self.batch
        return fp
