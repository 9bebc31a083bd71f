"""Real-time chunking (RTC) for the flow policy: a chunk whose first actions are pinned to a carried prefix.

With RTC the next chunk is inferred while the current one still executes
(Black, Galliker & Levine 2025). The new chunk's first ``d`` actions (the ones
that execute while it is being inferred) must equal the previous chunk's; the
paper's soft mask also pulls the actions after them towards the previous plan
so the seam is smooth. Both are an inpainting problem for the flow sampler.
Which indices are guided is the mask (:func:`prefix_weights`: ``hard``, the
``d`` executing actions only, the host's default; or ``soft``); the
measurement behind that default is in docs/design-notes.md.

The form here is training-free and capturable: at every Euler step the
sampler's clean-action estimate ``x0 = x - t * v`` is blended towards the
carried targets ``Y`` with per-index weights ``W`` (``x0' = x0 + W (Y - x0)``)
and the step is taken with the velocity that estimate implies,
``v' = (x - x0') / t = v - W (Y - x0) / t``. At the last step this makes the
output exactly ``x0 + W (Y - x0)``: a weight of 1 pins an action to its
target, 0 leaves it free, and ``W = 0`` gives the unguided chunk bit for bit.
It is the paper's guided inpainting with the vector-Jacobian product replaced
by the identity, which keeps it to element-wise ops on static buffers (no
autograd inside the graph), so it is captured like the plain sampler.

The trained alternative (the issue's "hard-prefix variant"): a checkpoint
fine-tuned with ``prefix_conditioning`` (:mod:`rollcap.rollout.learn.train_prefix`)
is sampled with :meth:`FlowVLA.inpaint_sample`, which writes the carried
targets into the pinned tokens at every Euler step with flow time 0, as in its
training; no guidance term. The runner picks it from the checkpoint's config
(``sampler="prefix"``), and it takes the hard mask only.

The carried state lives in the runner's static input buffers, so it is
captured with the graph and is part of the runner's capsule state:

- ``carried`` ``[1, H, A]``: the targets for the next chunk, i.e. the last
  committed chunk shifted by the execution horizon ``s`` (its actions
  ``s .. H-1``), zero beyond;
- ``carried_w`` ``[1, H, 1]``: the guidance weight of each index (zero until a
  chunk was committed, and always zero for naive asynchronous chunking);
- ``carried_n`` ``[1]``: how many carried actions are valid (0 before the
  first commit); the first ``d`` of them are the queue the host executes while
  the next chunk is inferred.

Reset of this state is the capsule's job: :meth:`RTCPolicyRunner.reset` only
drains a replay in flight, as for every runner, and the host's episode-initial
capsule restores the buffers. :meth:`RTCPolicyRunner.configure` (a new host)
empties them once.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.errors import BadInput
from rollcap.policies.flow_vla import FlowVLA
from rollcap.policies.obs_runner import ObsRunner
from rollcap.policies.runner import PolicyRunner

GUIDANCE = ("rtc", "naive")
"""``rtc``: guided towards the carried prefix; ``naive``: the queue executes, the new chunk is unconstrained."""


MASKS = ("hard", "soft")


def prefix_weights(horizon: int, execute_steps: int, delay: int, mask: str = "soft") -> np.ndarray:
    """The guidance weight of each of the new chunk's ``horizon`` indices.

    1 for the ``delay`` actions that execute during inference; with ``soft``
    (the RTC paper's mask) an exponential decay over the rest of the overlap
    with the previous chunk (indices below ``horizon - execute_steps``); 0
    elsewhere.
    """
    h, s, d = int(horizon), int(execute_steps), int(delay)
    w = np.zeros(h, np.float32)
    w[:d] = 1.0
    if mask == "hard":
        return w
    for i in range(d, h - s):
        c = (h - s - i) / (h - s - d + 1)
        w[i] = c * (math.exp(c) - 1.0) / (math.e - 1.0)
    return w


def guided_sample(model: FlowVLA, images, state, tokens, noise, carried, weights) -> torch.Tensor:
    """:meth:`FlowVLA.sample` with every Euler step's clean estimate blended towards ``carried`` (capturable).

    ``weights`` ``[1, H, 1]``; all-zero weights give ``FlowVLA.sample``'s chunk bit for bit on CPU.
    A fused model (:mod:`rollcap.policies.fused`) takes its own form of it.
    """
    if hasattr(model, "guided_sample"):
        return model.guided_sample(images, state, tokens, noise, carried, weights)
    cfg = model.cfg
    kv, valid = model.cfg_prefix(images, state, tokens)
    x = noise
    dt = -1.0 / cfg.num_steps
    for k in range(cfg.num_steps):
        tk = 1.0 - k / cfg.num_steps
        t = torch.full((2,), tk, device=state.device)
        v = model.expert(x.expand(2, -1, -1), t, kv, valid)
        v_u, v_c = v[1:2], v[0:1]
        vel = v_u + cfg.cfg_beta * (v_c - v_u)  # the same arithmetic as cfg_euler_step_reference
        x0 = x - tk * vel
        vel = vel - weights * (carried - x0) / tk
        x = x + dt * vel
    return x


def pigdm_sample(model: FlowVLA, images, state, tokens, noise, carried, weights, beta_max: float = 5.0) -> torch.Tensor:
    """The RTC paper's guidance (PiGDM with a vector-Jacobian product through the network), for comparison.

    Eager only: it differentiates through the action expert at every Euler step
    (about three times the plain sampler's work), which ``torch.jit.trace``
    does not capture. :func:`guided_sample` is the capturable form this
    project ships; docs/design-notes.md has the measurement between them.
    """
    cfg = model.cfg
    with torch.no_grad():
        kv, valid = model.cfg_prefix(images, state, tokens)
    x = noise
    dt = -1.0 / cfg.num_steps
    for k in range(cfg.num_steps):
        tk = 1.0 - k / cfg.num_steps
        t = torch.full((2,), tk, device=state.device)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v = model.expert(xg.expand(2, -1, -1), t, kv, valid)
            vel = v[1:2] + cfg.cfg_beta * (v[0:1] - v[1:2])
            x0 = xg - tk * vel
            (g,) = torch.autograd.grad(x0, xg, grad_outputs=(weights * (carried - x0)).detach())
        r2 = tk**2 / ((1.0 - tk) ** 2 + tk**2)
        c = beta_max if tk >= 1.0 else min(beta_max, tk / ((1.0 - tk) * r2))
        x = (x + dt * (vel.detach() - c * g)).detach()
    return x


class RTCPolicyRunner(PolicyRunner):
    """A :class:`PolicyRunner` whose chunk is guided by a carried prefix, and which carries it.

    Call :meth:`configure` (the host does, with its delay, execution horizon
    and guidance) before the first chunk. :meth:`result` commits the chunk it
    returns: the carried buffers then hold its actions from the execution
    horizon on, the targets (and :meth:`queue`) of the next chunk.

    Its fingerprint differs from a plain runner's (the carried buffers are
    inputs), so a plain recording never claims to be comparable with it.
    """

    SAMPLERS = ("identity", "pigdm", "prefix")
    """``identity``: the capturable guided inpainting (:func:`guided_sample`); ``pigdm``: the paper's guidance
    (eager); ``prefix``: hard inpainting by a prefix-conditioned checkpoint (:meth:`FlowVLA.inpaint_sample`)."""

    def __init__(
        self,
        model: FlowVLA,
        device: str | torch.device = "cpu",
        backend: str | None = None,
        lane=None,
        threads: int = 1,
        sampler: str | None = None,
        precision: str = "fp32",
    ):
        if sampler is None:  # the checkpoint decides: a prefix-conditioned one is sampled the way it was trained
            sampler = "prefix" if model.cfg.prefix_conditioning else "identity"
        if sampler not in self.SAMPLERS:
            raise ValueError(f"sampler: expected one of {self.SAMPLERS}, got {sampler!r}")
        if sampler == "prefix" and not model.cfg.prefix_conditioning:
            raise ValueError(
                "sampler 'prefix' needs a checkpoint trained with prefix_conditioning (python3 -m rollcap.rollout.learn.train_prefix)"
            )
        if sampler == "pigdm" and backend != "eager":
            raise ValueError(
                "sampler 'pigdm' differentiates through the network at every step: it runs on backend 'eager' only"
            )
        self.sampler = sampler
        h, a = model.cfg.horizon, model.cfg.action_dim
        ins = [
            BufferSpec("noise", (1, h, a), torch.float32),
            BufferSpec("carried", (1, h, a), torch.float32),
            BufferSpec("carried_w", (1, h, 1), torch.float32),
            BufferSpec("carried_n", (1,), torch.int64),
        ]
        ObsRunner.__init__(
            self,
            model,
            ins,
            [BufferSpec("actions", (1, h, a), torch.float32)],
            device,
            backend,
            lane,
            threads,
            precision=precision,
        )
        self.delay, self.shift, self.guidance = 0, model.cfg.execute_steps, "naive"
        self._weights = np.zeros(h, np.float32)  # unconfigured: no guidance, no queue (the plain chunk)

    def _graph_fn(self, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        images = [b[k] for k in self.cfg.image_keys]
        if self.sampler == "prefix":
            return {
                "actions": self.model.inpaint_sample(
                    images, b["state"], b["tokens"], b["noise"], b["carried"], b["carried_w"]
                )
            }
        sample = pigdm_sample if self.sampler == "pigdm" else guided_sample
        return {
            "actions": sample(self.model, images, b["state"], b["tokens"], b["noise"], b["carried"], b["carried_w"])
        }

    def _make_fingerprint(self) -> dict:
        fp = super()._make_fingerprint()
        fp["rtc_sampler"] = self.sampler
        return fp

    def configure(self, delay: int, execute_steps: int, guidance: str = "rtc", mask: str = "hard") -> None:
        """Set the schedule (called by a host when it is built) and empty the carried state.

        Raises:
            ValueError: ``guidance`` unknown, or ``delay``/``execute_steps`` outside ``0 <= d <= s``, ``d + s <= H``.
        """
        h = self.cfg.horizon
        if guidance not in GUIDANCE or mask not in MASKS:
            raise ValueError(f"guidance / mask: expected one of {GUIDANCE} / {MASKS}, got {guidance!r} / {mask!r}")
        if self.sampler == "prefix" and guidance == "rtc" and mask != "hard":
            raise ValueError(f"rtc_mask {mask!r}: a prefix-conditioned checkpoint pins its prefix (hard mask only)")
        if not (1 <= execute_steps <= h and 0 <= delay <= execute_steps and delay + execute_steps <= h):
            raise ValueError(
                f"inference delay {delay} with execution horizon {execute_steps}: need 0 <= delay <= execute_steps and delay + execute_steps <= {h} (the chunk length)"
            )
        self.delay, self.shift, self.guidance = int(delay), int(execute_steps), guidance
        w = prefix_weights(h, execute_steps, delay, mask) if guidance == "rtc" else np.zeros(h, np.float32)
        self._weights = w
        self.load_carried(np.zeros((h, self.cfg.action_dim), np.float32), np.zeros(h, np.float32), 0)

    def carried_state(self) -> dict[str, np.ndarray]:
        """Copies of the carried targets ``[H, A]``, weights ``[H]`` and count (what the next chunk is guided by)."""
        self._require_idle("carried state read")
        return {
            "carried": self.inputs["carried"][0].to("cpu").numpy().copy(),
            "carried_w": self.inputs["carried_w"][0, :, 0].to("cpu").numpy().copy(),
            "carried_n": int(self.inputs["carried_n"][0]),
        }

    def load_carried(self, carried: np.ndarray, weights: np.ndarray, count: int) -> None:
        """Write a carried state (replay feeds a recording's per-chunk prefix through this)."""
        h, a = self.cfg.horizon, self.cfg.action_dim
        carried, weights = np.asarray(carried, np.float32), np.asarray(weights, np.float32)
        if carried.shape != (h, a) or weights.shape != (h,):
            raise BadInput(f"carried prefix: expected ({h}, {a}) and ({h},), got {carried.shape} and {weights.shape}")
        self.write(
            {"carried": carried[None], "carried_w": weights[None, :, None], "carried_n": np.array([count], np.int64)},
            finite=("carried", "carried_w"),
        )

    def queue(self) -> np.ndarray:
        """The committed actions that execute while the next chunk is inferred: ``[min(d, n), A]``."""
        self._require_idle("queue read")
        n = min(self.delay, int(self.inputs["carried_n"][0]))
        return self.inputs["carried"][0, :n].to("cpu").numpy().copy()

    def result(self) -> np.ndarray:
        """Wait for the launched chunk, commit it as the carried state, return a copy ``[H, A]``."""
        chunk = super().result()
        h, s = self.cfg.horizon, self.shift
        carried = np.zeros_like(chunk)
        carried[: h - s] = chunk[s:]
        self.load_carried(carried, self._weights, h - s)
        return chunk

    def act_eager(self, obs: Mapping[str, object], noise: np.ndarray) -> np.ndarray:
        """One chunk through the plain module with the current carried state (nothing committed)."""
        values = {k: torch.from_numpy(v) for k, v in self._inputs(obs, noise).items()}
        for k in ("carried", "carried_w", "carried_n"):
            values[k] = self.inputs[k].to("cpu").clone()
        return self.eager(values)["actions"][0].to("cpu").numpy().copy()


_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rtc_twin(policy: PolicyRunner) -> RTCPolicyRunner:
    """An :class:`RTCPolicyRunner` over ``policy``'s model, device, backend and lane (built once per runner).

    Replay hands a real-time-chunking recording to it when it was given the
    plain runner. It shares the lane, so it is closed with ``policy``.
    """
    if isinstance(policy, RTCPolicyRunner):
        return policy
    twin = _TWINS.get(policy)
    if twin is None:
        twin = _TWINS[policy] = RTCPolicyRunner(
            policy.model, policy.device, policy.backend, policy.lane, precision=policy.precision
        )
    return twin
