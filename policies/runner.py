"""PolicyRunner: a FlowVLA replayed through a captured graph over static buffers.

Buffers: one uint8 image per camera, ``state``, ``tokens``, ``noise`` in; the
action chunk ``actions`` out. ``act`` validates, copies, replays and returns a
copy; ``submit``/``wait`` split it so the host overlaps the critic lane.
``act_eager`` is the reference path (no static buffers, no capture).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.checkpoint import load_module, save_checkpoint
from rollcap.kernels.errors import CheckpointMismatch
from rollcap.kernels.lanes import Lane, Ticket
from rollcap.policies.flow_vla import FlowVLA, FlowVLAConfig
from rollcap.policies.obs_runner import ObsRunner
from rollcap.policies.observation import noise_input
from rollcap.policies.shipped import DEFAULT_CHECKPOINT

KIND = "rollcap.FlowVLA"


def save_policy(model: FlowVLA, path: str | Path) -> Path:
    """Write ``path.safetensors`` + ``path.json``."""
    return save_checkpoint(model, model.cfg.to_json(), path, KIND)


def load_policy(path: str | Path = DEFAULT_CHECKPOINT, expect: FlowVLAConfig | None = None) -> FlowVLA:
    """Load a FlowVLA checkpoint; ``expect`` (if given) must equal its config."""
    model = load_module(path, KIND, FlowVLAConfig.from_json, FlowVLA)
    cfg = model.cfg
    if expect is not None and cfg != expect:
        diff = [
            f"{k}: checkpoint {getattr(cfg, k)!r} vs expected {getattr(expect, k)!r}"
            for k in cfg.to_json()
            if getattr(cfg, k) != getattr(expect, k)
        ]
        raise CheckpointMismatch(f"{path}: checkpoint config differs: {'; '.join(diff)}")
    return model


class PolicyRunner(ObsRunner):
    """Captured FlowVLA sampling on one lane.

    Args:
        model: the policy (put in eval mode, moved to ``device``).
        device: ``cpu`` or ``cuda[:i]``.
        backend: ``eager``/``jit``/``cuda`` (default: fastest exact for the device).
        lane: the lane to run on (default: a new one named ``policy``).
        threads: intra-op threads of a new CPU lane.
        batch: observations per replay (see :class:`ObsRunner`); ``start``/``result``/``act``
            are batch 1's, a batched core drives rows through :meth:`load_row` and :meth:`row_result`.
    """

    label = "policy"
    kind = KIND

    def __init__(
        self,
        model: FlowVLA,
        device: str | torch.device = "cpu",
        backend: str | None = None,
        lane: Lane | None = None,
        threads: int = 1,
        batch: int = 1,
        precision: str = "fp32",
    ):
        shape = (batch, model.cfg.horizon, model.cfg.action_dim)
        super().__init__(
            model,
            [BufferSpec("noise", shape, torch.float32)],
            [BufferSpec("actions", shape, torch.float32)],
            device,
            backend,
            lane,
            threads,
            batch,
            precision,
        )

    @property
    def execute_steps(self) -> int:
        """How many actions of each chunk the checkpoint is meant to execute before re-planning."""
        return self.cfg.execute_steps

    @property
    def noise_shape(self) -> tuple[int, int, int]:
        return (1, self.cfg.horizon, self.cfg.action_dim)

    @property
    def chunk_shape(self) -> tuple[int, int]:
        """``(H, A)``: the chunk (and noise) shape, as :class:`~rollcap.rollout.protocols.ChunkPolicy` names it."""
        return (self.cfg.horizon, self.cfg.action_dim)

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = [b[k] for k in self.cfg.image_keys]
        sample = self.model.sample if self.batch == 1 else self.model.sample_rows
        return {"actions": sample(images, b["state"], b["tokens"], b["noise"])}

    def _inputs(self, obs: Mapping[str, object], noise: np.ndarray) -> dict[str, np.ndarray]:
        values = self.obs_inputs(obs)
        values["noise"] = noise_input(noise, self.noise_shape[1:])
        return values

    def load(self, obs: Mapping[str, object], noise: np.ndarray) -> None:
        """Validate and write ``obs`` and ``noise`` into the static buffers (nothing launched)."""
        self.write(self._inputs(obs, noise))

    def submit(self, obs: Mapping[str, object], noise: np.ndarray) -> Ticket:
        """:meth:`load` then :meth:`launch`."""
        self.load(obs, noise)
        return self.launch()

    def start(self, obs: Mapping[str, object], noise: np.ndarray) -> None:
        """``ChunkPolicy.start``: validate, write and launch (returns at once; :meth:`result` waits)."""
        self.submit(obs, noise)

    def result(self) -> np.ndarray:
        """Wait for the launched chunk; returns a copy ``[H, A]`` (float32)."""
        self.wait()
        return self.row_result(0)

    def act(self, obs: Mapping[str, object], noise: np.ndarray) -> np.ndarray:
        """One chunk through the captured graph."""
        self.submit(obs, noise)
        return self.result()

    def load_row(self, row: int, obs: Mapping[str, object], noise: np.ndarray) -> None:
        """Validate and write one observation and its noise into row ``row`` (nothing launched)."""
        self.write_row(row, self._inputs(obs, noise))

    def row_result(self, row: int) -> np.ndarray:
        """Row ``row`` of the last waited-for replay's chunk, a copy ``[H, A]`` (call after :meth:`wait`)."""
        out = self.host_output(
            "actions"
        )  # a numpy copy of the row (CUDA: of its pinned twin, filled behind the replay)
        return out[row].copy() if out is not None else self.outputs["actions"][row].to("cpu").numpy().copy()

    def act_eager(self, obs: Mapping[str, object], noise: np.ndarray) -> np.ndarray:
        """One chunk through the plain module (the reference path)."""
        values = {k: torch.from_numpy(v) for k, v in self._inputs(obs, noise).items()}
        return self.eager(values)["actions"][0].to("cpu").numpy().copy()
