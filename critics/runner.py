"""CriticRunner: a ValueCritic replayed through its own captured graph and lane."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from rollcap.critics.value_critic import ValueCritic, ValueCriticConfig
from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.checkpoint import load_module, save_checkpoint
from rollcap.kernels.lanes import Lane, Ticket
from rollcap.critics.shipped import DEFAULT_CHECKPOINT
from rollcap.policies.obs_runner import ObsRunner

KIND = "rollcap.ValueCritic"


def save_critic(model: ValueCritic, path: str | Path) -> Path:
    """Write ``path.safetensors`` + ``path.json``."""
    return save_checkpoint(model, model.cfg.to_json(), path, KIND)


def load_critic(path: str | Path = DEFAULT_CHECKPOINT) -> ValueCritic:
    """Load a ValueCritic checkpoint."""
    return load_module(path, KIND, ValueCriticConfig.from_json, ValueCritic)


class CriticRunner(ObsRunner):
    """Captured critic on one lane: observation buffers in, ``value [batch]`` out (``batch``: see :class:`ObsRunner`)."""

    label = "critic"
    kind = KIND

    def __init__(
        self,
        model: ValueCritic,
        device: str | torch.device = "cpu",
        backend: str | None = None,
        lane: Lane | None = None,
        threads: int = 1,
        batch: int = 1,
        precision: str = "fp32",
    ):
        super().__init__(
            model, [], [BufferSpec("value", (batch,), torch.float32)], device, backend, lane, threads, batch, precision
        )

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = [b[k] for k in self.cfg.image_keys]
        return {"value": self.model.value(images, b["state"], b["tokens"])}

    def load(self, obs: Mapping[str, object]) -> None:
        """Validate and write ``obs`` into the static buffers (nothing launched)."""
        self.write(self.obs_inputs(obs))

    def submit(self, obs: Mapping[str, object]) -> Ticket:
        """:meth:`load` then :meth:`launch`."""
        self.load(obs)
        return self.launch()

    def start(self, obs: Mapping[str, object]) -> None:
        """``ChunkCritic.start``: validate, write and launch (returns at once; :meth:`result` waits)."""
        self.submit(obs)

    def result(self) -> float:
        """Wait for the launched replay; returns the value as a Python float (exact float32)."""
        self.wait()
        return self.row_result(0)

    def value(self, obs: Mapping[str, object]) -> float:
        self.submit(obs)
        return self.result()

    def load_row(self, row: int, obs: Mapping[str, object]) -> None:
        """Validate and write one observation into row ``row`` (nothing launched)."""
        self.write_row(row, self.obs_inputs(obs))

    def row_result(self, row: int) -> float:
        """Row ``row`` of the last waited-for replay's value (call after :meth:`wait`)."""
        out = self.host_output("value")  # read through numpy (CUDA: the pinned twin), the same float32 exactly
        return float(out[row]) if out is not None else float(self.outputs["value"][row].item())

    def value_eager(self, obs: Mapping[str, object]) -> float:
        """The reference path."""
        values = {k: torch.from_numpy(v) for k, v in self.obs_inputs(obs).items()}
        return float(self.eager(values)["value"][0].item())
