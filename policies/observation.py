"""Observations as the models see them, and a byte-level tokenizer.

An observation is a mapping with ``"state"`` (float32 vector), one uint8
``(H, W, 3)`` image per camera key (e.g. ``"image_front"``) and
``"instruction"`` (str). :class:`ObsSpec` turns it into the exact arrays the
static buffers hold, validating everything and never truncating or
broadcasting; :func:`noise_input` does the same for a chunk's noise.

Numpy only: an env worker validates its rows with these, and imports no torch.
The runner over these inputs is :class:`~rollcap.policies.obs_runner.ObsRunner`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rollcap.kernels.errors import BadInput
from rollcap.kernels.finite import all_finite

if TYPE_CHECKING:
    import torch

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259
# a dtype compares with a dtype ~3x faster than with a scalar type (np.uint8), and the same way
_UINT8, _FLOAT32 = np.dtype(np.uint8), np.dtype(np.float32)


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

    @functools.cached_property
    def _keys(self) -> tuple[str, ...]:
        return (*self.image_keys, "state", "instruction")

    @functools.cached_property
    def _key_set(self) -> frozenset[str]:
        return frozenset(self._keys)

    @functools.cached_property
    def _frame(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, 3)

    @functools.cached_property
    def _state_shape(self) -> tuple[int]:
        return (self.state_dim,)

    def buffer_shapes(self, batch: int = 1) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Buffer name -> (shape, dtype) for ``batch`` observations (one row each)."""
        import torch

        shapes = {k: ((batch, self.image_size, self.image_size, 3), torch.uint8) for k in self.image_keys}
        shapes["state"] = ((batch, self.state_dim), torch.float32)
        shapes["tokens"] = ((batch, self.max_tokens), torch.int64)
        return shapes

    def to_inputs(
        self, obs: Mapping[str, object], token_cache: dict[str, np.ndarray] | None = None, finite: bool = True
    ) -> dict[str, np.ndarray]:
        """Validate one observation and return batch-1 arrays keyed by buffer name.

        ``finite=False`` leaves the state's NaN / Inf check to the caller, who checks a whole batch's rows at once
        (:class:`~rollcap.rollout.batch.Rows`); every other check is made here."""
        if not isinstance(obs, dict) and not isinstance(obs, Mapping):  # (a dict first: the ABC check costs ~1 us)
            raise BadInput(f"observation: expected a mapping, got {type(obs).__name__}")
        if not self._key_set <= obs.keys():
            missing = [k for k in self._keys if k not in obs]
            raise BadInput(f"observation: missing {missing}; have {sorted(obs)}")
        out: dict[str, np.ndarray] = {}
        for k in self.image_keys:
            img = np.asarray(obs[k])
            if img.shape != self._frame or img.dtype != _UINT8:
                raise BadInput(f"observation[{k!r}]: expected uint8 {self._frame}, got {img.dtype} {img.shape}")
            out[k] = img[None]
        state = np.asarray(obs["state"])
        if state.shape != self._state_shape or state.dtype != _FLOAT32:
            raise BadInput(
                f"observation['state']: expected float32 ({self.state_dim},), got {state.dtype} {state.shape}"
            )
        if finite and not all_finite(state):
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


class ObsHandoff:
    """The observation a slot's policy row just validated, for the same slot's critic row: taken once.

    The host starts the policy and then the critic on the same observation
    object, with nothing in between; when the critic reads observations as the
    policy does (equal :class:`ObsSpec`), checking it again finds nothing new.
    :meth:`take` hands the policy's arrays over only for that same object and
    spec, and only once, so a later observation is always checked.
    """

    __slots__ = ("obs", "spec", "values")

    def __init__(self):
        self.obs = self.spec = self.values = None

    def put(self, obs, spec: ObsSpec, values: dict[str, np.ndarray]) -> None:
        self.obs, self.spec, self.values = obs, spec, values

    def take(self, obs, spec: ObsSpec) -> dict[str, np.ndarray] | None:
        """The validated arrays of ``obs`` if the policy's check of this very object under ``spec`` is waiting; else None."""
        values, same = self.values, self.obs is obs and (self.spec is spec or self.spec == spec)
        self.obs = self.spec = self.values = None
        return values if same else None


def noise_input(noise, shape: tuple[int, ...], finite: bool = True) -> np.ndarray:
    """Validate one chunk's flow noise (float32 of ``shape``, finite) into a batch-1 array.

    ``finite=False``: the NaN / Inf check is the caller's (as :meth:`ObsSpec.to_inputs`).

    Raises:
        BadInput: another dtype or shape, or a NaN / Inf.
    """
    noise = np.asarray(noise)
    if noise.shape != tuple(shape) or noise.dtype != _FLOAT32:
        raise BadInput(f"noise: expected float32 {tuple(shape)}, got {noise.dtype} {noise.shape}")
    if finite and not all_finite(noise):
        raise BadInput("noise: contains NaN or Inf")
    return noise[None]


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
