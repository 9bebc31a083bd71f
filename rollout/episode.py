"""What one recorded episode holds (the in-memory form of an npz / HDF5 demo).

Everything needed to replay the episode without the original process: the
seed, instruction, env id and kwargs, the initial simulator state, per-step
observations / executed actions / rewards / flags / who acted / sim states,
per-chunk noise / raw policy chunk / critic value / timings, the stop reason,
the success label and the fingerprints of policy, critic and env.

Arrays are numpy with fixed dtypes (see :data:`STEP_DTYPES`, :data:`CHUNK_DTYPES`);
``T`` is the number of executed env steps, ``C`` the number of chunk boundaries
(a chunk stopped before execution still counts: its noise, raw chunk and
critic value are recorded, ``chunk_start`` equals ``T``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FORMAT_VERSION = 1

ACTOR_POLICY, ACTOR_HUMAN, ACTOR_AGENT = 0, 1, 2
"""Who chose a step's action: the policy, a human intervention, or an outside agent's chunk (``execute(actions)``)."""

# per-step arrays: name -> dtype (leading dim T)
STEP_DTYPES = {
    "actions": np.float32,  # [T, A] what the env actually received
    "rewards": np.float64,  # [T]
    "terminated": np.bool_,  # [T]
    "truncated": np.bool_,  # [T]
    "dones": np.bool_,  # [T] terminated | truncated (robomimic's name)
    "actor": np.uint8,  # [T] ACTOR_POLICY, ACTOR_HUMAN or ACTOR_AGENT
    "states": np.float64,  # [T, D] flat sim state *before* each step (robomimic's name)
}

# per-chunk arrays: name -> dtype (leading dim C)
CHUNK_DTYPES = {
    "noise": np.float32,  # [C, H, A] host-generated flow noise
    "policy_chunk": np.float32,  # [C, H, A] raw policy output
    "critic_value": np.float32,  # [C]
    "chunk_start": np.int64,  # [C] step index at which the chunk began
    "latency_policy_s": np.float64,  # [C]
    "latency_critic_s": np.float64,  # [C]
    "latency_boundary_s": np.float64,  # [C] write + launch both + wait both + predicates
}

# per-chunk arrays of a real-time-chunking episode only (HostConfig.chunking naive / rtc): the carried
# state each chunk was inferred with, so policy replay feeds it back (absent otherwise: ordinary
# recordings keep their bytes)
RTC_CHUNK_DTYPES = {
    "rtc_carried": np.float32,  # [C, H, A] guidance targets (the previous chunk from the execution horizon on)
    "rtc_weights": np.float32,  # [C, H] guidance weight per index (all 0 for naive chunking and chunk 0)
}


# per-chunk arrays of a stochastic sampler's episode only (``sampler="sde"``, rollcap.policies.flow_sde): each chunk's
# per-step log-probabilities, its step noise and its denoising trace (absent otherwise)
FLOW_CHUNK_DTYPES = {
    "flow_logp": np.float32,  # [C, K] log N(x_{k+1}; mu_k, std_k^2) of each Euler step (sum: the chunk's)
    "flow_step_noise": np.float32,  # [C, K, H, A] the noise each step added (derived from the chunk's noise)
    "flow_trace": np.float32,  # [C, K+1, H, A] x_0 (the noise) .. x_K (the chunk)
}


NATURAL_ENDS = ("success", "terminated", "truncated")
"""Stop reasons of an episode that ran to its natural end; any other (a critic stop, a key, a limit, an error) cut it short."""


@dataclass
class EpisodeRecord:
    """One episode; see the module docstring. Validated by :meth:`validate`."""

    index: int
    """Episode index within its run (``demo_<index>`` in HDF5)."""
    seed: int
    """Episode seed: drives the env reset and every chunk's noise."""
    env_id: str
    env_kwargs: dict
    instruction: str
    initial_state: dict[str, np.ndarray]
    """``env.get_state()`` right after reset (exact sim state, RNG, counters)."""
    obs: dict[str, np.ndarray]
    """Per-step observations before each action, key -> ``[T, ...]`` (no instruction)."""
    final_obs: dict[str, np.ndarray]
    """The observation after the last executed step (for an episode of zero steps: the first
    observation), key -> ``[...]``. Every boundary's observation is ``obs[chunk_start]`` or this."""
    steps: dict[str, np.ndarray]
    """Per-step arrays, see :data:`STEP_DTYPES`."""
    chunks: dict[str, np.ndarray]
    """Per-chunk arrays, see :data:`CHUNK_DTYPES`."""
    stop_reason: str
    success: bool
    fingerprints: dict = field(default_factory=dict)
    """component -> fingerprint dict (policy, critic, env)."""
    config: dict = field(default_factory=dict)
    """The run config that produced the episode (JSON-able)."""
    error: str | None = None
    """``"<ExceptionType>: <message>"`` when the episode ended with stop reason ``error``; else None
    (stored only when set, so episodes without an error are byte-identical to earlier releases)."""
    origin: dict | None = None
    """Lineage of an episode that began at a chunk boundary of another (a branch): parent file, episode,
    chunk, step, branch, noise (see :mod:`rollcap.rollout.resume`); None for an ordinary episode (stored
    only when set, like ``error``)."""
    control_period_s: float | None = None
    """Simulated seconds one env step covers (the env's ``dt``; None when the env does not say). Stored beside the
    digest, like the codec, not in it: it describes the env's clock, and episodes keep the identity they had before
    it was recorded. Exporters take their frame rate from it."""

    @property
    def num_steps(self) -> int:
        return int(self.steps["actions"].shape[0])

    @property
    def num_chunks(self) -> int:
        return int(self.chunks["noise"].shape[0])

    @property
    def intervention(self) -> np.ndarray:
        """``[T]`` bool: True where a human's action replaced the policy's (``actor == ACTOR_HUMAN``)."""
        return self.steps["actor"] == ACTOR_HUMAN

    def policy_actions(self) -> np.ndarray:
        """``[T, A]``: the action the policy would have taken at each step (its planned chunk at that
        step's boundary), beside ``steps["actions"]``, what the env received (they differ on intervened
        and agent steps). Derived from ``chunks["policy_chunk"]`` and ``chunks["chunk_start"]``, which
        every recording holds; the policy keeps planning at every boundary while a human drives. With
        real-time chunking (``rtc_carried`` present) chunk k's own actions begin ``inference_delay`` steps
        after its launch; the steps before come from the previous chunk."""
        starts = self.chunks["chunk_start"]
        t = np.arange(self.num_steps)
        own = starts.copy()
        if "rtc_carried" in self.chunks and len(own) > 1:
            own[1:] += int(self.config.get("inference_delay", 0) or 0)
        k = np.searchsorted(own, t, side="right") - 1
        return self.chunks["policy_chunk"][k, t - starts[k]]

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field of the wrong name, dtype or length."""
        t, c = self.num_steps, self.num_chunks
        chunk_dtypes = {
            **CHUNK_DTYPES,
            **(RTC_CHUNK_DTYPES if "rtc_carried" in self.chunks else {}),
            **(FLOW_CHUNK_DTYPES if "flow_logp" in self.chunks else {}),
        }
        for table, dtypes, n in (("steps", STEP_DTYPES, t), ("chunks", chunk_dtypes, c)):
            arrays = getattr(self, table)
            if set(arrays) != set(dtypes):
                raise ValueError(f"episode {self.index}: {table} keys {sorted(arrays)} != {sorted(dtypes)}")
            for k, dt in dtypes.items():
                a = arrays[k]
                if a.dtype != np.dtype(dt) or a.shape[:1] != (n,):
                    raise ValueError(
                        f"episode {self.index}: {table}[{k!r}] is {a.dtype}{a.shape}, expected {np.dtype(dt)} with {n} rows"
                    )
        for k, a in self.obs.items():
            if a.shape[:1] != (t,):
                raise ValueError(f"episode {self.index}: obs[{k!r}] has {a.shape[0]} rows, expected {t}")
