"""Built-in tasks and exact-state adapters for gymnasium / MuJoCo envs.

Import direction: ``rollcap.envs`` imports ``rollcap.kernels`` and
``rollcap.capsule`` only (calls point downward; ``capsule`` only inside
``check_env_exact``, so importing this package does not import torch);
``rollcap.rollout`` imports this package. Nothing here knows what an episode
of the rollout host is. Importing this package registers
``rollcap/PushBlock-v0`` and ``rollcap/MetaWorld-<task>`` (the 50 MetaWorld v3
tasks; building one needs ``metaworld``, registering them does not) with
gymnasium, once however often it is imported.
"""

from __future__ import annotations

import rollcap.envs.gl  # noqa: F401  first: it sets MUJOCO_GL (when unset) before anything imports mujoco
import gymnasium as gym

from rollcap.envs.adapters import (
    STATELESS_WRAPPERS,
    ExactStateWrapper,
    WithoutExactState,
    declares_exact_state,
    exact_state_of,
    find_exact_state,
    physics_row,
)
from rollcap.envs.bench import bench_env
from rollcap.envs.checks import EnvExactness, ExactCheckReport, check_env_exact, probe_exactness
from rollcap.envs.compare import canonical_bytes
from rollcap.envs.collect import Episode, collect_demos, episode_seeds
from rollcap.envs.errors import BadAction, CheckFailed, NoExactState, RenderUnavailable, StateMismatch
from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.envs.metaworld import register_metaworld
from rollcap.envs.push_block import ENV_ID, PushBlockConfig, PushBlockEnv
from rollcap.envs.scene import (
    BLOCKS,
    INSTRUCTION_TEMPLATE,
    TARGETS,
    VOCAB,
    SceneSpec,
    make_instruction,
    parse_instruction,
)
from rollcap.envs.task_state import TASK_ATTRIBUTES

if ENV_ID not in gym.registry:
    # gym.make returns the bare env, so get_state()/set_state() are on the object
    # it returns: no TimeLimit (the env truncates itself; its step counter is in
    # its exact state), no OrderEnforcing (it checks reset-before-step itself),
    # no PassiveEnvChecker (check_env_exact runs gymnasium's full checker; the
    # passive one breaks a step right after set_state() into a never-reset env).
    gym.register(
        id=ENV_ID,
        entry_point="rollcap.envs.push_block:PushBlockEnv",
        order_enforce=False,
        disable_env_checker=True,
    )
register_metaworld()

__all__ = [
    "BLOCKS",
    "ENV_ID",
    "INSTRUCTION_TEMPLATE",
    "STATELESS_WRAPPERS",
    "TASK_ATTRIBUTES",
    "TARGETS",
    "VOCAB",
    "BadAction",
    "CheckFailed",
    "EnvExactness",
    "Episode",
    "ExactCheckReport",
    "ExactStateWrapper",
    "ExpertNoise",
    "NoExactState",
    "PushBlockConfig",
    "PushBlockEnv",
    "RenderUnavailable",
    "SceneSpec",
    "ScriptedExpert",
    "StateMismatch",
    "WithoutExactState",
    "bench_env",
    "canonical_bytes",
    "check_env_exact",
    "collect_demos",
    "declares_exact_state",
    "episode_seeds",
    "exact_state_of",
    "find_exact_state",
    "make_instruction",
    "parse_instruction",
    "physics_row",
    "probe_exactness",
]
