"""A worker's row views: the policy and critic a worker's hosts drive, whose rows live in shared memory.

:class:`ProxyPolicy` / :class:`ProxyCritic` are what :class:`~rollcap.rollout.batch.RowPolicy`
and :class:`~rollcap.rollout.batch.RowCritic` are in the GPU-owning process,
with the batched runner in another process: ``start`` validates the observation
(and noise) with the runner's own checks (:meth:`ObsSpec.to_inputs
<rollcap.policies.observation.ObsSpec.to_inputs>` and :func:`~rollcap.policies.observation.noise_input`,
which ``PolicyRunner.load_row`` calls: the same checks, the same messages) and writes the row's bytes into the shared block,
where the parent copies every row into the runner's static inputs in one copy.
``result`` reads the row of the replay's outputs the parent copied back. So a
row's bytes are the ones ``load_row`` writes in process, and its chunk and
value the ones ``row_result`` reads. The fingerprint is the batched runner's
(rows are interchangeable), as the parent sent it.

Imports point downward: ``policies.observation`` (the checks, numpy only: no torch here) and the block.
"""

from __future__ import annotations

import numpy as np

from rollcap.policies.observation import ObsSpec, noise_input


class _Proxy:
    def __init__(self, arrays: dict[str, np.ndarray], prefix: str, row: int, obs_spec: ObsSpec, fingerprint: dict):
        self.row, self.obs_spec, self.fingerprint = row, obs_spec, fingerprint
        self._tokens: dict[str, np.ndarray] = {}
        self._rows = {k[len(prefix) :]: v[row] for k, v in arrays.items() if k.startswith(prefix)}
        self._latency = arrays["latency"][row]

    def obs_inputs(self, obs) -> dict[str, np.ndarray]:
        """Validate one observation into batch-1 arrays (as the runner's ``obs_inputs``, with this proxy's token cache)."""
        return self.obs_spec.to_inputs(obs, self._tokens)

    def reset(self) -> None:
        """Called at each episode start: nothing is in flight here (the parent owns the replay)."""

    def _write(self, values: dict[str, np.ndarray]) -> None:
        for name, v in values.items():
            self._rows[name][...] = v[0]

    def state_fingerprint(self) -> dict:
        return dict(self.fingerprint)


class ProxyPolicy(_Proxy):
    """A :class:`~rollcap.rollout.protocols.ChunkPolicy` over row ``row`` of the parent's batched ``PolicyRunner``."""

    def __init__(self, arrays, row: int, obs_spec: ObsSpec, chunk_shape, execute_steps: int, fingerprint: dict):
        super().__init__(arrays, "p.", row, obs_spec, fingerprint)
        self.chunk_shape, self.execute_steps = tuple(chunk_shape), int(execute_steps)
        self.noise_shape = (1, *self.chunk_shape)
        self._actions = arrays["actions"][row]

    @property
    def last_latency_s(self) -> float:
        return float(self._latency[0])

    def start(self, obs, noise: np.ndarray) -> None:
        """Validate and write this row (the parent replays the batch once every worker's rows are written)."""
        values = self.obs_inputs(obs)
        values["noise"] = noise_input(noise, self.chunk_shape)
        self._write(values)

    def result(self) -> np.ndarray:
        return self._actions.copy()


class ProxyCritic(_Proxy):
    """A :class:`~rollcap.rollout.protocols.ChunkCritic` over row ``row`` of the parent's batched ``CriticRunner``."""

    def __init__(self, arrays, row: int, obs_spec: ObsSpec, fingerprint: dict):
        super().__init__(arrays, "c.", row, obs_spec, fingerprint)
        self._value = arrays["value"]

    @property
    def last_latency_s(self) -> float:
        return float(self._latency[1])

    def start(self, obs) -> None:
        self._write(self.obs_inputs(obs))

    def result(self) -> float:
        return float(self._value[self.row])
