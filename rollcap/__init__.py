"""rollcap: rollouts for robot policies.

The few names a user needs, in one place::

    import rollcap
    result = rollcap.run(episodes=5, out="runs/api")   # what `rollcap run` does
    result, summary = rollcap.branch("runs/api", episode=0, chunk=3, n=8)   # `rollcap branch`
    manifest = rollcap.recap(["runs/api"], "runs/recap1")   # `rollcap recap`: learn from the run
    print(result.summary["success_rate"])

The parts live in subpackages (``rollcap.rollout``, ``rollcap.envs``,
``rollcap.policies``, ...). These names come from ``rollcap.rollout`` on first
use (``Parts`` from its ``build``; ``check_capturable`` and ``CaptureHazard``,
the capture guard for a function of yours, from ``rollcap.kernels``), so ``import rollcap.envs`` alone does not import torch. Importing
registers the gymnasium ids ``rollcap/ChunkPushBlock-v0`` and
``rollcap/NoiseSteerPushBlock-v0`` (see :mod:`rollcap.rollout.gym.envs`): at
once when gymnasium is already imported, else right after gymnasium's own
import, so ``import rollcap`` itself imports nothing heavy (the ``rollcap``
command holds Ctrl-C from its first line; see :mod:`rollcap.rollout.cli`).
"""

from __future__ import annotations

import sys

import _signal  # built in (no file, no time): the ``rollcap`` command holds SIGINT / SIGTERM before any other import


def _is_command() -> bool:
    """This process is the ``rollcap`` command (the console script, or ``python -m rollcap.rollout.cli``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.replace("\\", "/").rsplit("/", 1)[-1] in ("rollcap", "rollcap.exe", "rollcap-script.py"):
        return True
    orig = getattr(sys, "orig_argv", [])
    return (
        argv0 == "-m" and "-m" in orig and orig[orig.index("-m") + 1 : orig.index("-m") + 2] == ["rollcap.rollout.cli"]
    )


if hasattr(_signal, "pthread_sigmask") and _is_command():  # rollcap.rollout.cli.main unblocks them behind its handler
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT, _signal.SIGTERM})

import importlib  # noqa: E402
import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402

__all__ = [
    "ChunkCritic",
    "ChunkPolicy",
    "EpisodeEnd",
    "EpisodeRecord",
    "EventBus",
    "HostConfig",
    "Parts",
    "CaptureHazard",
    "check_capturable",
    "Interrupted",
    "RecapConfig",
    "RolloutHost",
    "RunResult",
    "Subscriber",
    "branch",
    "export",
    "load",
    "make_env",
    "recap",
    "run",
]

_ELSEWHERE = {
    "Parts": "rollcap.rollout.spec",
    "CaptureHazard": "rollcap.kernels.errors",
    "check_capturable": "rollcap.kernels.guard",
}
"""Names that come from a module other than ``rollcap.rollout`` (each imported on first use)."""

GYM_IDS = {
    "rollcap/ChunkPushBlock-v0": "rollcap.rollout.gym.envs:make_chunk_env",
    "rollcap/NoiseSteerPushBlock-v0": "rollcap.rollout.gym.envs:make_noise_steering_env",
}
"""Gymnasium ids for RL loops (:mod:`rollcap.rollout.gym.envs`), registered on import; ``rollcap.envs`` registers the tasks."""
GYM_VECTOR = {
    "rollcap/ChunkPushBlock-v0": "rollcap.rollout.gym.vector:make_chunk_vector_env",
    "rollcap/NoiseSteerPushBlock-v0": "rollcap.rollout.gym.vector:make_noise_steering_vector_env",
}
"""Their vector entry points (``gym.make_vec(id, num_envs=N)``: one graph at batch N, :mod:`rollcap.rollout.gym.vector`)."""


def _register_gym_ids() -> None:
    import gymnasium as gym

    for env_id, entry in GYM_IDS.items():
        if env_id not in gym.registry:  # the envs check their own arguments; gymnasium's passive checker is off
            gym.register(
                env_id,
                entry_point=entry,
                vector_entry_point=GYM_VECTOR.get(env_id),
                disable_env_checker=True,
                order_enforce=False,
            )


class _RegisterAfterGymnasium(importlib.abc.MetaPathFinder):
    """Registers :data:`GYM_IDS` as soon as gymnasium's own import finishes (gymnasium has no plugin hook).

    It finds gymnasium's spec through the other finders once, wraps that one
    loader's ``exec_module`` and takes itself off ``sys.meta_path``.
    """

    def find_spec(self, name, path=None, target=None):
        if name != "gymnasium":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_gym_ids()

        spec.loader.exec_module = exec_and_register
        return spec


if "gymnasium" in sys.modules:
    _register_gym_ids()
elif not any(isinstance(f, _RegisterAfterGymnasium) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterGymnasium())


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module 'rollcap' has no attribute {name!r}")
    if name in _ELSEWHERE:
        value = getattr(importlib.import_module(_ELSEWHERE[name]), name)
    else:
        import rollcap.rollout

        value = getattr(rollcap.rollout, {"load": "load_any", "branch": "branch_episode"}.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
