"""CriticRunner: a ValueCritic replayed through its own captured graph and lane."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from rollcap.critics.value_critic import ValueCritic, ValueCriticConfig
from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.checkpoint import load_module, save_checkpoint
from rollcap.kernels.fingerprint import tensor_digest
from rollcap.kernels.lanes import Lane, Ticket
from rollcap.kernels.runner import GraphRunner

KIND = "rollcap.ValueCritic"
DEFAULT_CHECKPOINT = Path(__file__).parent / "weights" / "pushblock_critic.json"


def save_critic(model: ValueCritic, path: str | Path) -> Path:
    """Write ``path.safetensors`` + ``path.json``."""
    return save_checkpoint(model, model.cfg.to_json(), path, KIND)


def load_critic(path: str | Path = DEFAULT_CHECKPOINT) -> ValueCritic:
    """Load a ValueCritic checkpoint."""
    return load_module(path, KIND, ValueCriticConfig.from_json, ValueCritic)


class CriticRunner(GraphRunner):
    """Captured critic on one lane: observation buffers in, ``value [1]`` out."""

    def __init__(self, model: ValueCritic, device: str | torch.device = "cpu", backend: str | None = None, lane: Lane | None = None, threads: int = 1):
        self.model = model.to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.cfg = model.cfg
        self.spec = self.cfg.obs_spec
        self._tokens: dict[str, np.ndarray] = {}
        ins = [BufferSpec(k, s, d) for k, (s, d) in self.spec.buffer_shapes().items()]
        outs = [BufferSpec("value", (1,), torch.float32)]
        digest = tensor_digest(dict(self.model.state_dict()))
        super().__init__(self._graph_fn, ins, outs, device, backend, [self.model], lane, "critic", digest, threads)

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = [b[k] for k in self.cfg.image_keys]
        return {"value": self.model.value(images, b["state"], b["tokens"])}

    def submit(self, obs: Mapping[str, object]) -> Ticket:
        """Validate and write ``obs``, then launch one replay."""
        self.write(self.spec.to_inputs(obs, self._tokens))
        return self.launch()

    def result(self) -> float:
        """Wait for the launched replay; returns the value as a Python float (exact float32)."""
        return float(self.wait()["value"][0].item())

    def value(self, obs: Mapping[str, object]) -> float:
        self.submit(obs)
        return self.result()

    def value_eager(self, obs: Mapping[str, object]) -> float:
        """The reference path."""
        values = {k: torch.from_numpy(v) for k, v in self.spec.to_inputs(obs, self._tokens).items()}
        return float(self.eager(values)["value"][0].item())

    def _make_fingerprint(self) -> dict:
        fp = super()._make_fingerprint()
        fp["model"] = KIND
        fp["config"] = self.cfg.to_json()
        fp["dtype"] = "float32"
        return fp
