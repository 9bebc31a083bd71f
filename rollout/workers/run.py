"""``rollcap.run(envs=N, env_workers=W)``'s parts: one env here for the checks, the runners at batch N, W workers.

Imports point downward: ``batch`` (the runners), ``build`` (the env), ``errors`` and the workers' core.
"""

from __future__ import annotations

import os

from rollcap.rollout.batch import make_batched_runners
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.workers.core import EnvWorkers


def worker_parts(env, policy, critic, parts, host_cfg, run_cfg, own: list, poll, check) -> tuple[EnvWorkers, object]:
    """The workers of a run, and the env this process built to check the env and fit the runners (both appended to ``own``).

    The env is given to ``check(env, require_exact)`` before anything is captured; the runners are captured here at
    batch ``envs`` (``graphs``), the workers started (each builds its slots' envs) before this returns.
    """
    from rollcap.rollout.build import make_env

    n = run_cfg.envs
    if not isinstance(env, str) or not all(x is None or isinstance(x, (str, os.PathLike)) for x in (policy, critic)):
        raise ConfigError(
            "env_workers", "env workers build their envs from an env id and the runners from checkpoints; got objects"
        )
    probe = make_env(parts.env_id, parts.env_kwargs)
    own.append(probe)
    poll()
    check(probe, run_cfg.require_exact)
    policy, critic = make_batched_runners(parts, n, probe, graphs=run_cfg.graphs)
    own.extend(r for part in (policy, critic) for r in (part if isinstance(part, list) else [part]) if r is not None)
    poll()
    workers = EnvWorkers(parts.env_id, parts.env_kwargs, policy, critic, host_cfg, run_cfg.env_workers, poll_stop=poll)
    own.insert(0, workers)  # closed first: the workers stop before the runners and the env close
    return workers, probe
