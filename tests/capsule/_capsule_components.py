"""Synthetic Stateful components for the capsule tests (imported by conftest and by subprocess scripts).

- :class:`TinyPolicy`: a recurrent MLP over a :class:`BufferSet`, replayed through a
  :class:`CapturedGraph` (``eager`` or ``jit``); the hidden state feeds back, so the
  next output depends on every buffer.
- :class:`ToySim`: numpy arrays mimicking simulator state (float64, int64 0-d, bool, uint8).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rollcap.kernels import BufferSet, BufferSpec, CapturedGraph, device_fingerprint, tensor_digest

B, D, H = 4, 8, 16


class TinyPolicy:
    """``y = lin2(h) * (1 + tokens/255) + step/100``, ``h = mask ? tanh(lin1([x + noise/2, h_prev])) : h_prev``."""

    def __init__(self, backend: str = "jit", seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.lin1 = torch.nn.Linear(D + H, H)
        self.lin2 = torch.nn.Linear(H, D)
        with torch.no_grad():
            for p in [*self.lin1.parameters(), *self.lin2.parameters()]:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        self.inp = BufferSet(
            [
                BufferSpec("x", (B, D), torch.float32),
                BufferSpec("noise", (B, D), torch.float32),
                BufferSpec("h_prev", (B, H), torch.float32),
                BufferSpec("step", (1,), torch.int64),
                BufferSpec("mask", (B,), torch.bool),
                BufferSpec("tokens", (6,), torch.uint8),
            ],
            label="tiny.in",
        )
        self.out = BufferSet(
            [
                BufferSpec("y", (B, D), torch.float32),
                BufferSpec("h", (B, H), torch.float32),
                BufferSpec("value", (), torch.float32),
            ],
            label="tiny.out",
        )
        self.backend = backend
        self.graph = CapturedGraph(
            self._fn, self.inp, self.out, backend, modules=[self.lin1, self.lin2], label="tiny"
        ).prepare()

    def _fn(self, i: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        z = torch.cat([i["x"] + 0.5 * i["noise"], i["h_prev"]], dim=-1)
        h = torch.where(i["mask"].unsqueeze(-1), torch.tanh(self.lin1(z)), i["h_prev"])
        y = self.lin2(h) * (1.0 + i["tokens"].to(torch.float32).sum() / 255.0) + i["step"].to(torch.float32) * 0.01
        return {"y": y, "h": h, "value": y.mean()}

    def step(self, x: torch.Tensor, noise: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Write inputs, replay, feed the hidden state back; returns a copy of ``y``."""
        self.inp.write({"x": x, "noise": noise, "tokens": tokens, "mask": mask})
        self.graph.replay()
        self.inp.write({"h_prev": self.out["h"], "step": self.inp["step"] + 1})
        return self.out["y"].clone()

    # -- Stateful ----------------------------------------------------------------
    def live_state(self) -> dict[str, torch.Tensor]:
        state = {f"in.{k}": v for k, v in self.inp.tensors().items()}
        state.update({f"out.{k}": v for k, v in self.out.tensors().items()})
        return state

    def load_live_state(self, state: Mapping[str, torch.Tensor]) -> None:
        ins = {k[3:]: v for k, v in state.items() if k.startswith("in.")}
        outs = {k[4:]: v for k, v in state.items() if k.startswith("out.")}
        for name, v in ins.items():
            self.inp.check(name, v)
        for name, v in outs.items():
            self.out.check(name, v)
        self.inp.load(ins)
        self.out.load(outs)

    def state_fingerprint(self) -> dict:
        weights = {
            k: v
            for k, v in [*self.lin1.state_dict().items(), *[(f"2.{k}", v) for k, v in self.lin2.state_dict().items()]]
        }
        return {
            "component": "tiny",
            "backend": self.backend,
            "weights": tensor_digest(weights),
            **device_fingerprint("cpu"),
        }


class ToySim:
    """A deterministic toy simulator whose whole state is a few numpy arrays."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.qpos = rng.standard_normal(7)
        self.qvel = np.zeros(7)
        self.contacts = np.zeros(3, dtype=bool)
        self.tick = np.zeros((), dtype=np.int64)
        self.pixels = np.zeros((4, 4, 3), dtype=np.uint8)

    def step(self, action: np.ndarray) -> np.ndarray:
        self.qvel += 0.1 * (action - 0.5 * self.qpos) - 0.01 * self.contacts.sum()
        self.qpos += 0.01 * self.qvel
        self.contacts[:] = self.qpos[:3] > 0
        self.tick += 1
        self.pixels[:] = (np.abs(self.qpos[:3]) * 50 + int(self.tick)).astype(np.uint8)
        return self.qpos.copy()

    def live_state(self) -> dict[str, np.ndarray]:
        return {
            "qpos": self.qpos,
            "qvel": self.qvel,
            "contacts": self.contacts,
            "tick": self.tick,
            "pixels": self.pixels,
        }

    def load_live_state(self, state: Mapping[str, np.ndarray]) -> None:
        live = self.live_state()
        if set(state) != set(live):
            raise ValueError(f"toy sim: need {sorted(live)}, got {sorted(state)}")
        for k, v in state.items():
            if not isinstance(v, np.ndarray) or v.shape != live[k].shape or v.dtype != live[k].dtype:
                raise ValueError(f"toy sim: {k} does not fit")
        for k, v in state.items():
            np.copyto(live[k], v)

    def state_fingerprint(self) -> dict:
        return {"sim": "toy", "dt": 0.01, "numpy": np.__version__}


def make_world(backend: str = "jit", seed: int = 0) -> dict:
    """A policy and a sim, the components of every test capsule."""
    return {"policy": TinyPolicy(backend, seed), "sim": ToySim(seed)}


def chunk_inputs(k: int, branch_noise: int | None = None) -> dict[str, torch.Tensor]:
    """Deterministic inputs of chunk ``k``; ``branch_noise`` picks another noise draw."""
    gen = torch.Generator().manual_seed(1000 + k)
    x = torch.randn(B, D, generator=gen)
    noise_gen = torch.Generator().manual_seed(5000 + k + 7919 * (branch_noise or 0))
    noise = torch.randn(B, D, generator=noise_gen)
    tokens = torch.arange(6, dtype=torch.uint8) * (k % 5 + 1)
    mask = torch.tensor([True, k % 2 == 0, True, k % 3 != 0])
    return {"x": x, "noise": noise, "tokens": tokens, "mask": mask}


def run_chunk(world: dict, k: int, branch_noise: int | None = None) -> bytes:
    """Step policy then sim for chunk ``k``; returns the bytes of what came out."""
    y = world["policy"].step(**chunk_inputs(k, branch_noise))
    qpos = world["sim"].step(y[0, :7].to(torch.float64).numpy())
    return y.numpy().tobytes() + qpos.tobytes()


def dirty(world: dict, rounds: int = 3) -> None:
    """Unrelated replays that overwrite every live buffer.

    The last sim step is steered so every contact flag flips relative to the start.
    """
    sim = world["sim"]
    flags = sim.contacts.copy()
    for j in range(rounds):
        run_chunk(world, 900 + j, branch_noise=17)
    target = np.where(flags, -5.0, 5.0)
    action = np.zeros(7)
    action[:3] = ((target - sim.qpos[:3]) / 0.01 - sim.qvel[:3] + 0.01 * sim.contacts.sum()) / 0.1 + 0.5 * sim.qpos[:3]
    sim.step(action)


def state_bytes(components: dict) -> dict[str, dict[str, tuple]]:
    """component -> buffer -> (dtype, shape, raw bytes) of the live state, copied."""
    out = {}
    for name, comp in components.items():
        out[name] = {}
        for buf, v in comp.live_state().items():
            arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
            out[name][buf] = (str(arr.dtype), arr.shape, arr.tobytes())
    return out
