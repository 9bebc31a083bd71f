"""ObsRunner: a captured graph whose inputs are one observation (and extra inputs), at batch 1 or N.

Imports point downward: ``kernels`` (the graph runner, precision, fp8) and
:mod:`~rollcap.policies.observation` (the numpy side: the spec and its checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.errors import BadInput
from rollcap.kernels.fingerprint import tensor_digest
from rollcap.kernels.fp8 import fp8_facts, to_fp8
from rollcap.kernels.precision import cast_linears, check_precision
from rollcap.kernels.runner import GraphRunner


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
        self.obs_spec = self.cfg.obs_spec
        self._tokens: dict[str, np.ndarray] = {}
        ins = [BufferSpec(k, s, d) for k, (s, d) in self.obs_spec.buffer_shapes(batch).items()] + extra_inputs
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

    def obs_inputs(self, obs: Mapping[str, object], finite: bool = True) -> dict[str, np.ndarray]:
        """Validate one observation into batch-1 arrays for the buffers (``finite=False``: but its NaN / Inf check,
        which a batch's :class:`~rollcap.rollout.batch.Rows` make for every row at once)."""
        return self.obs_spec.to_inputs(obs, self._tokens, finite)

    def write_row(self, row: int, values: Mapping[str, np.ndarray]) -> None:
        """Copy one row's validated batch-1 arrays (``obs_inputs`` and the extra inputs) into row ``row`` (nothing launched)."""
        self._require_idle("inputs written")
        for name, v in values.items():
            self.inputs.write_row(name, row, v[0])

    def write_rows(self, rows: Sequence[Mapping[str, np.ndarray] | None]) -> None:
        """:meth:`write_row` for the rows at once (``rows[i]``: row ``i``'s values, or None: left as it is; every row
        names the same inputs): a batch whose every row is written costs one copy an input (nothing launched)."""
        self._require_idle("inputs written")
        self.inputs.write_rows(rows)

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
