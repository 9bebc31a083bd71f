"""Flow-SDE: the FlowVLA's Euler sampler with Gaussian noise at every step, so a chunk has an exact log-likelihood.

pi0's convention (``t = 1`` noise, ``t = 0`` the action, velocity target ``noise - action``), ``K`` Euler steps at
``t_k = 1 - k/K``, ``dt = -1/K``. The plain sampler's step is ``x_{k+1} = x_k + dt v_k``. Here each step is the
reverse-time SDE whose marginals are the ODE's (Flow-GRPO, Liu et al. 2025; piRL's Flow-SDE, arXiv 2510.25889)::

    mu_k     = x_k + dt [v_k + sigma_k^2 / (2 t_k) (x_k + (1 - t_k) v_k)]
    x_{k+1}  = mu_k + sigma_k sqrt(-dt) eps_k,        sigma_k = a sqrt(t_k / (1 - t_k))

(at ``t_0 = 1`` the denominator is ``1 - t_1``, as Flow-GRPO does), so a chunk's log-probability given its initial
noise and observation is the sum of the ``K`` Gaussian log-densities ``log N(x_{k+1}; mu_k, sigma_k^2 (-dt) I)``: exact,
and differentiable in the weights through ``mu_k``. ``a`` (the noise level) is the one setting; ``a = 0`` is the ODE.
``v_k`` is the guided velocity ``v_u + beta (v_c - v_u)``; with ``cfg_beta`` 1 (both shipped checkpoints) that is
the conditioned branch, computed alone (half the work of the plain sampler's two branches).

**Why the SDE and not a learned noise head (Flow-Noise).** Its marginals are the ODE's: at the starting weights the
SDE's chunks are distributed as the plain sampler's from standard-normal noise, so RL starts from the shipped
policy as deployed, and a policy fine-tuned this way is deployed with the plain sampler its training distribution
matches. A noise head adds weights the deployed (noise-free) policy drops, and a train/deploy gap. One number
instead of a network, and the checkpoint stays a plain FlowVLA checkpoint.

**Randomness.** ``x_0`` is the host's noise for the chunk (derived from the episode seed, recorded). The step noises
``eps_0 .. eps_{K-1}`` are drawn on the host too (:func:`step_noise_of`: PCG64 seeded by SHA-256 of ``x_0``'s bytes),
written into the runner's static ``step_noise`` buffer, and recorded with the chunk (``chunks/flow_step_noise``). So
the recorded noise alone makes every chunk again: replay, branch and resume need nothing new.

:class:`FlowSDERunner` is a :class:`~rollcap.policies.runner.PolicyRunner` whose captured graph is :func:`sde_sample`:
its outputs are the chunk, each step's log-probability ``logp [B, K]`` and the denoising trace
``trace [B, K + 1, H, A]`` (``x_0 .. x_K``). :func:`step_logp` is the learner's side: the same log-densities from a
recorded trace, all ``K`` steps in one batched expert call, differentiable.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSpec
from rollcap.policies.flow_vla import FlowVLA, guidance_inputs
from rollcap.policies.layers import timestep_embedding
from rollcap.policies.obs_runner import ObsRunner
from rollcap.policies.runner import PolicyRunner

SAMPLER = "sde"
"""The sampler's name (``Parts.sampler``, the fingerprint's ``sampler``)."""
DEFAULT_NOISE_LEVEL = 0.5
"""``a``: piRL's Flow-SDE default; Flow-GRPO uses 0.7 for images."""
MAX_NOISE_LEVEL = 4.0


def check_noise_level(level) -> float:
    """``level`` as a float in (0, :data:`MAX_NOISE_LEVEL`]; ValueError naming ``noise_level`` otherwise."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level <= MAX_NOISE_LEVEL:
        raise ValueError(f"noise_level: expected a number in (0, {MAX_NOISE_LEVEL:g}], got {level!r}")
    return float(level)


@dataclass(frozen=True)
class Schedule:
    """The SDE's per-step constants (host floats, the same in the captured graph and the learner)."""

    t: tuple[float, ...]
    """Flow time at each step's start."""
    dt: float
    drift: tuple[float, ...]
    """``sigma_k^2 / (2 t_k)``."""
    std: tuple[float, ...]
    """``sigma_k sqrt(-dt)``: the transition's standard deviation."""
    log_std: tuple[float, ...]


def schedule(num_steps: int, level: float) -> Schedule:
    """The constants of a ``num_steps``-step SDE at noise level ``level``."""
    k_steps = int(num_steps)
    t = tuple(1.0 - k / k_steps for k in range(k_steps))
    dt = -1.0 / k_steps
    t_cap = t[1] if k_steps > 1 else 0.5  # at t = 1: Flow-GRPO's 1 - t_1 in the denominator
    sigma2 = [level * level * tk / (1.0 - (tk if tk < 1.0 else t_cap)) for tk in t]
    std = tuple(math.sqrt(s * -dt) for s in sigma2)
    return Schedule(t, dt, tuple(s / (2.0 * tk) for s, tk in zip(sigma2, t)), std, tuple(math.log(s) for s in std))


def step_noise_of(noise: np.ndarray, num_steps: int) -> np.ndarray:
    """The step noises ``[K, H, A]`` (float32 standard normal) of a chunk whose initial noise is ``noise`` ``[H, A]``:
    PCG64 seeded by SHA-256 of ``noise``'s shape, dtype and bytes, so they follow from the recorded noise."""
    noise = np.ascontiguousarray(noise)
    h = hashlib.sha256(f"rollcap.flow-sde|{noise.dtype.str}|{noise.shape}|".encode())
    h.update(noise.tobytes())
    seed = int.from_bytes(h.digest()[:16], "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    return rng.standard_normal((int(num_steps), *noise.shape), dtype=np.float32)


def check_model(model: FlowVLA) -> None:
    """Refuse a model the SDE sampler does not run (ValueError naming the config field)."""
    cfg = model.cfg
    if cfg.prefix_conditioning:
        raise ValueError("prefix_conditioning: the sde sampler runs models without a clean action prefix")
    variant = cfg.to_json().get("variant")
    if variant is not None:
        raise ValueError(f"variant: the sde sampler runs the plain FlowVLA, not its {variant} re-parameterisation")


def prefix(model: FlowVLA, images, state, tokens, n):
    """The expert's keys/values and key mask for ``n`` observation rows: the conditioned rows alone when
    ``cfg_beta`` is 1, else ``n`` conditioned then ``n`` dropped (the plain sampler's guidance rows)."""
    if model.cfg.cfg_beta == 1.0:
        return model._prefix(images, state, tokens, model.cfg_adv[:1].expand(n))
    return model._prefix(*guidance_inputs(model.cfg_adv, images, state, tokens, n, model.cfg.shared_prefix))


def velocity(model: FlowVLA, kv, valid, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The guided velocity at ``x`` ``[n, H, A]``, flow time ``t`` ``[n]`` (kv and mask as :func:`prefix` made them)."""
    beta = model.cfg.cfg_beta
    if beta == 1.0:
        return model.expert(x, t, kv, valid)
    n = x.shape[0]
    v = model.expert(x.repeat(2, 1, 1), t.repeat(2), kv, valid)
    return v[n:] + beta * (v[:n] - v[n:])


def step_mean(x, v, t, dt: float, drift):
    """``mu = x + dt (v + drift (x + (1 - t) v))`` (``t`` and ``drift`` floats, or tensors broadcasting over x)."""
    return x + dt * (v + drift * (x + (1.0 - t) * v))


def gaussian_logp(x_next, mean, std, log_std) -> torch.Tensor:
    """``log N(x_next; mean, std^2 I)`` summed over every dimension but the first (``std``: a float or a tensor that
    broadcasts)."""
    z = (x_next - mean) / std
    d = x_next[0].numel()
    return -0.5 * z.square().flatten(1).sum(1) - d * (log_std + 0.5 * math.log(2.0 * math.pi))


def sde_sample(model: FlowVLA, images, state, tokens, noise, step_noise, level: float):
    """``noise [n, H, A]`` and ``step_noise [n, K, H, A]`` -> ``(actions [n, H, A], logp [n, K], trace [n, K+1, H, A])``
    (capturable: every constant is a host float)."""
    sched = schedule(model.cfg.num_steps, level)
    n = noise.shape[0]
    kv, valid = prefix(model, images, state, tokens, n)
    x, xs, lps = noise, [noise], []
    for k in range(model.cfg.num_steps):
        v = velocity(model, kv, valid, x, torch.full((n,), sched.t[k], device=noise.device))
        mean = step_mean(x, v, sched.t[k], sched.dt, sched.drift[k])
        x = mean + sched.std[k] * step_noise[:, k]
        lps.append(gaussian_logp(x, mean, sched.std[k], sched.log_std[k]))
        xs.append(x)
    return x, torch.stack(lps, 1), torch.stack(xs, 1)


def expert_steps(model: FlowVLA, kv, valid, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The guided velocity at every step of a chunk in one call: ``x [B, K, H, A]`` (each step's input), ``t [K]`` ->
    ``v [B, K, H, A]``. The ``K`` steps' action tokens form one sequence over the prefix's keys/values (computed once,
    not repeated per step); a block mask lets each step's tokens attend to the prefix and to their own step only, so
    each step is what the action expert computes for it alone (the same arithmetic, other GEMM shapes)."""
    expert, (b, k_steps, h, a) = model.expert, x.shape
    beta = model.cfg.cfg_beta
    rows = x.reshape(b, k_steps * h, a) if beta == 1.0 else x.reshape(b, k_steps * h, a).repeat(2, 1, 1)
    z = expert.in_proj(rows) + expert.pos.repeat(k_steps, 1)
    z = z + expert.time_mlp(timestep_embedding(t, expert.width)).repeat_interleave(h, 0)
    own = torch.block_diag(*[torch.ones(h, h, dtype=torch.bool, device=x.device)] * k_steps)
    mask = torch.cat([valid[:, None, :].expand(-1, k_steps * h, -1), own.expand(valid.shape[0], -1, -1)], 2)
    for blk, pkv in zip(expert.blocks, kv):
        z = blk(z, mask, pkv)
    v = expert.out(expert.ln_out(z)).view(-1, k_steps, h, a)
    return v if beta == 1.0 else v[b:] + beta * (v[:b] - v[b:])


def step_logp(model: FlowVLA, images, state, tokens, trace: torch.Tensor, level: float, kv=None) -> torch.Tensor:
    """Each step's log-probability ``[B, K]`` of the recorded denoising ``trace`` ``[B, K+1, H, A]`` under ``model``
    (differentiable; all ``K`` steps in one expert call, :func:`expert_steps`). ``kv``: :func:`prefix`'s output for
    these observations, when the caller computed it already (a frozen prefix: once per chunk, without gradients)."""
    b, k_steps = trace.shape[0], trace.shape[1] - 1
    sched = schedule(k_steps, level)
    if kv is None:
        kv = prefix(model, images, state, tokens, b)
    dev, shape = trace.device, (1, k_steps, 1, 1)
    t = torch.tensor(sched.t, device=dev)
    x, nxt = trace[:, :k_steps], trace[:, 1:]
    v = expert_steps(model, kv[0], kv[1], x, t)
    drift = torch.tensor(sched.drift, device=dev).view(shape)
    mean = step_mean(x, v, t.view(shape), sched.dt, drift)
    z = (nxt - mean) / torch.tensor(sched.std, device=dev).view(shape)
    log_std = torch.tensor(sched.log_std, device=dev)
    return -0.5 * z.square().flatten(2).sum(2) - x[0, 0].numel() * (log_std + 0.5 * math.log(2.0 * math.pi))


class FlowSDERunner(PolicyRunner):
    """A :class:`~rollcap.policies.runner.PolicyRunner` whose captured graph is :func:`sde_sample` (see the module
    docstring). Inputs: the observation, ``noise [B, H, A]`` and ``step_noise [B, K, H, A]`` (derived from the noise
    here, on the host); outputs: ``actions``, ``logp [B, K]`` and ``trace [B, K+1, H, A]``. The other arguments are
    :class:`PolicyRunner`'s; ``noise_level`` is ``a``. Its fingerprint names the sampler and the level.
    """

    def __init__(self, model: FlowVLA, noise_level: float = DEFAULT_NOISE_LEVEL, device="cpu", backend=None,
                 lane=None, threads: int = 1, batch: int = 1, precision: str = "fp32"):  # fmt: skip
        check_model(model)
        self.noise_level = check_noise_level(noise_level)
        cfg = model.cfg
        k, h, a = cfg.num_steps, cfg.horizon, cfg.action_dim
        self._steps = np.zeros((batch, k, h, a), np.float32)  # each row's step noise as written (the record's)
        ObsRunner.__init__(
            self,
            model,
            [BufferSpec("noise", (batch, h, a), torch.float32), BufferSpec("step_noise", (batch, k, h, a), torch.float32)],
            [BufferSpec("actions", (batch, h, a), torch.float32), BufferSpec("logp", (batch, k), torch.float32),
             BufferSpec("trace", (batch, k + 1, h, a), torch.float32)],
            device, backend, lane, threads, batch, precision,
        )  # fmt: skip

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = [b[k] for k in self.cfg.image_keys]
        actions, logp, trace = sde_sample(
            self.model, images, b["state"], b["tokens"], b["noise"], b["step_noise"], self.noise_level
        )
        return {"actions": actions, "logp": logp, "trace": trace}

    def _inputs(self, obs, noise: np.ndarray) -> dict[str, np.ndarray]:
        values = super()._inputs(obs, noise)
        values["step_noise"] = step_noise_of(values["noise"][0], self.cfg.num_steps)[None]
        return values

    def write_row(self, row: int, values: Mapping[str, np.ndarray]) -> None:
        """:meth:`ObsRunner.write_row`, and the row's step noise: derived on the host from its chunk noise where
        ``values`` has none (what the record's ``flow_step_noise`` holds: the recorded noise alone makes the chunk
        again)."""
        super().write_row(row, self._with_steps(row, values))

    def _with_steps(self, row: int, values: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """``values`` with the row's step noise (derived from its chunk noise where it has none), kept for its record."""
        if "noise" in values and "step_noise" not in values:
            values = {**values, "step_noise": step_noise_of(np.asarray(values["noise"])[0], self.cfg.num_steps)[None]}
        if "step_noise" in values:
            self._steps[row] = values["step_noise"][0]
        return values

    def write_rows(self, rows: Sequence[Mapping[str, np.ndarray] | None]) -> None:
        """:meth:`ObsRunner.write_rows`, each row's step noise derived as :meth:`write_row` does."""
        super().write_rows(
            [None if values is None else self._with_steps(row, values) for row, values in enumerate(rows)]
        )

    def load(self, obs, noise: np.ndarray) -> None:
        self.load_row(0, obs, noise)

    def row_flow(self, row: int, outputs: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Row ``row``'s record of the last waited-for replay (copies): ``logp [K]``, ``step_noise [K, H, A]`` and
        ``trace [K+1, H, A]``. ``outputs``: the replay's outputs on the host, when the caller fetched them already."""
        out = {}
        for name in ("logp", "trace"):
            host = outputs[name] if outputs is not None else self.host_output(name)
            out[name] = (host[row] if host is not None else self.outputs[name][row].to("cpu").numpy()).copy()
        out["step_noise"] = self._steps[row].copy()
        return out

    def chunk_flow(self) -> dict[str, np.ndarray]:
        """The last chunk's :meth:`row_flow` (batch 1; the host records it with the chunk)."""
        return self.row_flow(0)

    def _make_fingerprint(self) -> dict:
        fp = super()._make_fingerprint()
        fp["sampler"] = SAMPLER
        fp["noise_level"] = self.noise_level
        return fp
