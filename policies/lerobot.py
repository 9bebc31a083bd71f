"""LeRobotPolicy: a LeRobot ``PreTrainedPolicy`` (and its processors) behind rollcap's ChunkPolicy.

Per episode the host calls :meth:`LeRobotPolicy.reset` (``policy.reset()``);
per chunk boundary :meth:`~LeRobotPolicy.start` maps the observation to the
policy's input features and runs ``preprocessor -> predict_action_chunk ->
postprocessor``. ``select_action`` and its queues are bypassed: the host
decides how many actions of a chunk run before the next boundary
(``execute_steps``, the config's ``n_action_steps``).

Determinism: the host's noise for the chunk goes in as ``predict_action_chunk(...,
noise=)`` where the policy samples (Diffusion Policy, pi0, SmolVLA); when the
policy's noise has another shape than the chunk it is drawn from a generator
seeded with the digest of the host's noise, so it is still a pure function of
it. Where a sampler draws from torch's global RNG at every step (DDPM), the
noise cannot be injected: the fingerprint says ``"noise": "not injected"``
and carries a fresh token per call, so replay reports "not comparable"
instead of "exact" or "diverged". ACT takes no noise (deterministic in eval).

Backends: ``eager`` (the default) calls ``predict_action_chunk`` as it is.
``jit`` (CPU) and ``cuda`` (a CUDA device) run it (ACT's forward) through rollcap's own capture, a
:class:`~rollcap.kernels.runner.GraphRunner` over static buffers: the
preprocessed tensor features and the noise in, ``actions`` out; the
preprocessor and postprocessor stay eager. Where capture is not possible
(DDPM draws the global RNG; the capture guard refuses the function, as it does DDIM's timesteps made from
numpy inside the call; the trace fails; the model needs the batch's
non-tensor entries; the plan disagrees with eager on a probe) it runs eager
and :attr:`LeRobotPolicy.backend` says why (``"eager (reason)"``). The
fingerprint carries ``"backend"`` whenever a capture was asked for, so a
chunk recorded with one backend and replayed with another is "not
comparable", never falsely "exact"; an eager policy's fingerprint has no
``"backend"`` (as every LeRobot recording made before capture existed).

No live state between chunks (the chunk is a function of observation, noise
and weights), so this is not a capsule ``Stateful``: the host's capsule holds
nothing of it.

LeRobot lives in its own environment (``bash scripts/lerobot_env.sh``:
Python >= 3.12, torch < 2.12); it is imported lazily, so this module imports
anywhere. Imports point downward: ``kernels`` only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rollcap.kernels.buffers import BufferSpec
from rollcap.kernels.fingerprint import device_fingerprint, tensor_digest
from rollcap.kernels.graph import default_backend
from rollcap.kernels.lanes import CallerLane, make_lane
from rollcap.kernels.runner import GraphRunner

from rollcap.policies.lerobot_features import (  # re-exported: importers name them from here
    INSTALL_HINT as INSTALL_HINT,
    STATE_KEYS as STATE_KEYS,
    _NOT_BITS as _NOT_BITS,
    BACKENDS as BACKENDS,
    NOISE as NOISE,
    INSTRUCTION_FEATURE as INSTRUCTION_FEATURE,
    INSTRUCTION as INSTRUCTION,
    instruction_vector as instruction_vector,
    quiet_import_logs as quiet_import_logs,
    require_lerobot as require_lerobot,
    map_features as map_features,
    _to_feature as _to_feature,
    _noise_shape as _noise_shape,
    _seed_of as _seed_of,
)


class LeRobotPolicy:
    """A LeRobot policy as a :class:`~rollcap.rollout.protocols.ChunkPolicy`. Single caller: the host's thread.

    Args:
        policy: a LeRobot ``PreTrainedPolicy`` (put in eval mode).
        preprocessor / postprocessor: its pipelines (``make_pre_post_processors``).
        keys: LeRobot input feature -> rollcap observation key, for what the defaults
            (:func:`map_features`) do not find.
        source: where it came from (recorded in the fingerprint).
        backend: one of :data:`BACKENDS`; ``jit`` needs a CPU policy, ``cuda`` a CUDA one.
        threads: intra-op threads of the captured plan's replay (CPU; it runs in the caller's thread).

    Attributes:
        backend: what runs the model: ``"eager"``, ``"jit"``, ``"cuda"``, or ``"eager (why capture was not possible)"``.
        capture_max_abs_diff: captured vs eager chunk on two probe inputs, max |difference| (0.0: bit-identical
            there); None when nothing was captured.

    Raises:
        ValueError: (naming ``backend``) a backend not in :data:`BACKENDS`, or one that does not run on the device.
    """

    def __init__(
        self,
        policy,
        preprocessor,
        postprocessor,
        keys: Mapping[str, str] | None = None,
        source: str = "",
        backend: str = "eager",
        threads: int = 1,
    ):
        self.policy = policy.eval()
        self.preprocessor, self.postprocessor = preprocessor, postprocessor
        self.cfg = cfg = policy.config
        self.keys = dict(keys or {})
        self.source = str(source)
        action = cfg.output_features.get("action")
        if action is None:
            raise ValueError(
                f"policy {cfg.type!r} has no 'action' output feature (it has {sorted(cfg.output_features)})"
            )
        self.action_dim = int(action.shape[0])
        horizon = (
            int(cfg.n_action_steps) if cfg.type == "diffusion" else int(getattr(cfg, "chunk_size", cfg.n_action_steps))
        )
        self.chunk_shape = (horizon, self.action_dim)
        self.execute_steps = min(int(getattr(cfg, "n_action_steps", horizon)), horizon)
        self.takes_noise = "noise" in inspect.signature(policy.predict_action_chunk).parameters
        self.noise_shape = _noise_shape(cfg, self.action_dim) if self.takes_noise else None
        self.injects = self.takes_noise and not (
            cfg.type == "diffusion" and getattr(cfg, "noise_scheduler_type", "") == "DDPM"
        )
        self.n_obs_steps = int(getattr(cfg, "n_obs_steps", 1) or 1)
        self.device = torch.device(str(getattr(cfg, "device", None) or "cpu"))
        self._mapping: tuple[frozenset, dict[str, str]] | None = None
        self._chunk: np.ndarray | None = None
        if backend not in BACKENDS:
            raise ValueError(f"backend: a LeRobot policy runs {', '.join(BACKENDS)}; got {backend!r}")
        if backend not in ("eager", default_backend(self.device)):
            raise ValueError(
                f"backend: {backend!r} does not run on {self.device} (use {default_backend(self.device)!r} or 'eager')"
            )
        self.requested_backend = backend
        self.backend = "eager"
        self.capture_max_abs_diff: float | None = None
        self._graph: GraphRunner | None = None
        self._tensor_keys: tuple[str, ...] = ()
        self.trace_warnings: list[str] = []
        if backend != "eager":
            why = self._capture(backend, threads)
            self.backend = backend if why is None else f"eager ({why})"
            if why is not None:
                warnings.warn(
                    f"lerobot.{cfg.type}: backend {backend!r} not possible, it runs eager: {why}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self._static_fp = self._fingerprint_base()

    @classmethod
    def load(
        cls,
        directory,
        device: str = "cpu",
        keys: Mapping[str, str] | None = None,
        backend: str = "eager",
        threads: int = 1,
    ) -> LeRobotPolicy:
        """Load what ``save_pretrained`` wrote (the policy, and the processors beside it), offline; ``backend``, ``threads`` as for the class.

        Raises:
            ImportError: lerobot is not installed here.
            ValueError: ``directory`` holds no saved LeRobot policy, or a bad ``backend``.
        """
        directory = Path(directory)
        if not (directory / "config.json").is_file():
            raise ValueError(
                f"{directory}: no config.json; expected a directory written by a LeRobot policy's save_pretrained"
            )
        require_lerobot()
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        try:
            cfg = PreTrainedConfig.from_pretrained(str(directory), local_files_only=True)
        except Exception as err:  # draccus parse errors, an unknown policy type
            raise ValueError(
                f"{directory}/config.json: not a LeRobot policy config ({type(err).__name__}: {err})".splitlines()[0]
            ) from err
        cfg.device = str(device)
        if getattr(
            cfg, "pretrained_backbone_weights", None
        ):  # the saved weights replace them; building must not download
            cfg.pretrained_backbone_weights = None
        policy = get_policy_class(cfg.type).from_pretrained(str(directory), config=cfg, local_files_only=True)
        overrides = {"device_processor": {"device": str(device)}}
        pre, post = make_pre_post_processors(
            cfg, pretrained_path=str(directory), preprocessor_overrides=overrides, postprocessor_overrides=overrides
        )
        return cls(policy, pre, post, keys=keys, source=str(directory), backend=backend, threads=threads)

    # -- ChunkPolicy ---------------------------------------------------------
    def reset(self) -> None:
        """Episode start: the LeRobot policy's own reset (its queues); a chunk not yet taken is dropped."""
        self.policy.reset()
        self._chunk = None

    def start(self, obs, noise: np.ndarray) -> None:
        """Map ``obs`` to the input features, run the chunk (it is ready when this returns)."""
        self._chunk = None
        if not isinstance(obs, Mapping):
            raise TypeError(
                f"LeRobotPolicy needs a dict observation (keys -> arrays, plus 'instruction'), got {type(obs).__name__}"
            )
        noise = np.asarray(noise)
        if noise.shape != self.chunk_shape or noise.dtype != np.float32 or not np.isfinite(noise).all():
            raise ValueError(f"noise: expected finite float32 {self.chunk_shape}, got {noise.dtype} {noise.shape}")
        batch: dict[str, Any] = {}
        for name, key in self._map(obs).items():
            feat = self.cfg.input_features[name]
            value = instruction_vector(obs[key], int(feat.shape[0])) if key == INSTRUCTION else obs[key]
            batch[name] = _to_feature(name, feat, value)
        batch["task"] = [str(obs.get("instruction", ""))]
        batch = self._preprocess(batch)
        policy_noise = self._policy_noise(noise) if self.injects else None
        actions = self._eager(batch, policy_noise) if self._graph is None else self._replay(batch, policy_noise)
        with torch.inference_mode():
            actions = self.postprocessor(actions)
        chunk = actions.detach().to("cpu", torch.float32).numpy()
        if chunk.shape[0] != 1 or chunk.shape[1:] != self.chunk_shape:
            raise ValueError(
                f"policy {self.cfg.type!r} returned a chunk of shape {chunk.shape}, expected (1, *{self.chunk_shape})"
            )
        self._chunk = chunk[0].copy()

    def result(self) -> np.ndarray:
        """The chunk :meth:`start` computed, float32 ``[H, A]`` (a copy)."""
        if self._chunk is None:
            raise RuntimeError("result() called without a successful start()")
        out, self._chunk = self._chunk, None
        return out

    def state_fingerprint(self) -> dict:
        """Weights (policy and processors), config, lerobot and torch versions, device, how noise is used, and
        ``backend`` (what ran) when a capture was asked for."""
        if self.takes_noise and not self.injects:
            return {**self._static_fp, "draw": uuid.uuid4().hex}  # unrecorded RNG draws: never equal to another call's
        return dict(self._static_fp)

    def close(self) -> None:
        """Release the captured plan's lane, if any (the host calls it when the run ends)."""
        if self._graph is not None:
            self._graph.lane.close()

    # -- internals -----------------------------------------------------------
    def _map(self, obs: Mapping[str, Any]) -> dict[str, str]:
        keys = frozenset(obs)
        if self._mapping is None or self._mapping[0] != keys:
            self._mapping = (keys, map_features(self.cfg.input_features, keys, self.keys))
        return self._mapping[1]

    def _preprocess(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The preprocessor, then the history axis where the policy reads ``n_obs_steps`` observations."""
        with torch.inference_mode():
            batch = self.preprocessor(batch)
            if self.n_obs_steps > 1:  # one observation per boundary: the history is the current one repeated
                for name in self.cfg.input_features:
                    batch[name] = batch[name].unsqueeze(1).expand(-1, self.n_obs_steps, *batch[name].shape[1:])
        return batch

    def _eager(self, batch: dict[str, Any], noise: torch.Tensor | None) -> torch.Tensor:
        with torch.inference_mode():
            return self.policy.predict_action_chunk(batch, **({} if noise is None else {"noise": noise}))

    def _replay(self, batch: dict[str, Any], noise: torch.Tensor | None) -> torch.Tensor:
        """The captured plan over the static buffers: the batch's tensors (and the noise) in, a copy of ``actions`` out."""
        values = {k: batch[k] for k in self._tensor_keys} | ({} if noise is None else {NOISE: noise})
        self._graph.write(values)  # BadInput (a ValueError naming the buffer) if the preprocessor gave another shape
        self._graph.launch()
        return self._graph.wait()["actions"].clone()

    def _capture(self, backend: str, threads: int) -> str | None:
        """Capture ``predict_action_chunk`` over static buffers; None when done, else why not (the policy stays eager).

        Two probe inputs (zeros, then seeded random features and noise) go through the preprocessor; their
        tensor entries fix the buffers. The model must give the same chunk without the batch's other entries
        (``task``), and the plan must agree with eager on both probes (``torch.allclose``); the largest
        difference is kept in :attr:`capture_max_abs_diff`.
        """
        if self.takes_noise and not self.injects:
            return "DDPM draws torch's global RNG at every denoising step; its noise cannot be a buffer"
        gen = torch.Generator().manual_seed(0)
        probes = []
        for random in (False, True):
            raw = {
                name: (torch.rand(tuple(f.shape), generator=gen) if random else torch.zeros(tuple(f.shape)))
                for name, f in self.cfg.input_features.items()
            }
            noise = torch.randn((1, *self.noise_shape), generator=gen).to(self.device) if self.injects else None
            probes.append((self._preprocess({**raw, "task": [""]}), noise))
        tensors = {k: v for k, v in probes[0][0].items() if isinstance(v, torch.Tensor)}
        others = sorted(set(probes[0][0]) - set(tensors))
        self._tensor_keys = tuple(tensors)

        def model(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            kw = {"noise": b[NOISE]} if self.injects else {}
            return {"actions": self.policy.predict_action_chunk({k: b[k] for k in self._tensor_keys}, **kw)}

        ref = [self._eager(batch, noise) for batch, noise in probes]
        try:
            with torch.no_grad():
                alone = model(
                    {k: probes[0][0][k] for k in self._tensor_keys} | ({NOISE: probes[0][1]} if self.injects else {})
                )["actions"]
        except Exception as err:  # noqa: BLE001 - a model's own code: any failure means it needs what was left out
            return f"predict_action_chunk needs the batch's non-tensor entries {others} ({type(err).__name__})"
        if alone.shape != ref[0].shape or not torch.equal(alone, ref[0]):
            return f"predict_action_chunk's chunk depends on the batch's non-tensor entries {others}"
        specs = [BufferSpec(k, tuple(v.shape), v.dtype) for k, v in tensors.items()]
        if self.injects:
            specs.append(BufferSpec(NOISE, (1, *self.noise_shape), torch.float32))
        lane = CallerLane("lerobot", threads) if self.device.type == "cpu" else make_lane("lerobot", self.device)
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", torch.jit.TracerWarning)
                self._graph = GraphRunner(
                    model,
                    specs,
                    [BufferSpec("actions", tuple(ref[0].shape), ref[0].dtype)],
                    self.device,
                    backend,
                    [self.policy],
                    lane=lane,
                    label="lerobot",
                )
            got = [self._replay(batch, noise) for batch, noise in probes]
        except Exception as err:  # noqa: BLE001 - tracing a model's own code can fail in any way; it is said, not hidden
            self._graph = None
            lane.close()
            return f"{backend} capture failed: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"[:300]
        self.capture_max_abs_diff = max(float((g - r).abs().max()) for g, r in zip(got, ref))
        if not all(torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(got, ref)):
            self.close()
            self._graph = None
            return (
                f"the {backend} plan disagrees with eager on a probe input (max |diff| {self.capture_max_abs_diff:.3g})"
            )
        self._say_tracer_warnings(seen, backend)
        return None

    def _say_tracer_warnings(self, seen, backend: str) -> None:
        """The tracer's warnings (shapes read as Python numbers, a constant tensor iterated) as one warning naming
        where they came from and what checked the plan; any other warning as it was."""
        tracer = [w for w in seen if issubclass(w.category, torch.jit.TracerWarning)]
        for w in seen:
            if w not in tracer:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.trace_warnings = sorted(
            {f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}" for w in tracer}
        )
        if tracer:
            warnings.warn(
                f"lerobot.{self.cfg.type}: the {backend} plan was traced through {len(tracer)} TracerWarning(s) at "
                f"{', '.join(self.trace_warnings)} (values read as Python numbers are fixed in the plan); it matched eager on two probe "
                f"inputs (max |diff| {self.capture_max_abs_diff:.3g})",
                RuntimeWarning,
                stacklevel=4,
            )

    def _policy_noise(self, noise: np.ndarray) -> torch.Tensor:
        if self.noise_shape == self.chunk_shape:
            t = torch.from_numpy(noise.copy())
        else:  # another shape (a longer horizon, padded action dims): a pure function of the host's noise
            t = torch.randn(self.noise_shape, generator=torch.Generator().manual_seed(_seed_of(noise)))
        return t[None].to(self.device)

    def _fingerprint_base(self) -> dict:
        from importlib.metadata import version

        tensors = {f"policy.{k}": v for k, v in self.policy.state_dict().items()}
        for side, pipe in (("pre", self.preprocessor), ("post", self.postprocessor)):
            for i, step in enumerate(getattr(pipe, "steps", [])):
                sd = step.state_dict() if callable(getattr(step, "state_dict", None)) else {}
                tensors.update({f"{side}{i}.{k}": v for k, v in sd.items() if isinstance(v, torch.Tensor)})
        cfg = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in _NOT_BITS}
        cfg_json = json.dumps(cfg, sort_keys=True, default=str)
        if not self.takes_noise:
            noise = "not an input"
        elif not self.injects:
            noise = "not injected"
        else:
            noise = "injected" if self.noise_shape == self.chunk_shape else "derived (seeded by the host noise digest)"
        return {
            **device_fingerprint(self.device),
            "kind": f"lerobot.{self.cfg.type}",
            "lerobot": version("lerobot"),
            "weights_digest": tensor_digest({k: v.detach().cpu() for k, v in tensors.items()}),
            "config_digest": hashlib.sha256(cfg_json.encode()).hexdigest()[:16],
            "dtype": str(next(self.policy.parameters()).dtype).removeprefix("torch."),
            "noise": noise,
            "obs_history": "current observation"
            if self.n_obs_steps == 1
            else f"current observation x{self.n_obs_steps}",
            **({"backend": self.backend} if self.requested_backend != "eager" else {}),
        }
