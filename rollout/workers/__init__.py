"""Env workers: the N envs of a batched run in worker processes; the GPU-owning process keeps the batched graphs.

:class:`~rollcap.rollout.workers.core.EnvWorkers` is one more episode source
(and, with :meth:`~rollcap.rollout.workers.core.EnvWorkers.record_to`, sink):
``rollcap run --envs N --env-workers W`` / ``rollcap.run(envs=N, env_workers=W)``.
Observations, noise, chunks and values cross in shared memory
(:mod:`~rollcap.rollout.workers.shm`); every step's data stays in the worker,
which records its episodes in its own shard (:mod:`~rollcap.rollout.workers.child`).
An episode's bytes do not depend on where its env lived at the same batch.
"""

from rollcap.rollout.workers.core import EnvWorkers

__all__ = ["EnvWorkers"]
