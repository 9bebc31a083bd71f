"""Test helper, run as a script: record or replay an env another package registers (gymnasium-robotics' FetchReach-v4).

    python _foreign_env.py record OUT [--plain]   one short episode; --plain: import the package and use the plain id
    python _foreign_env.py cli ARGS...            rollcap ARGS..., then says on stderr whether gymnasium_robotics was imported

gymnasium-robotics 1.4.2 cannot build its Fetch envs under MuJoCo 4: its
``set_joint_qpos`` asserts ``joint_type in (mjJNT_HINGE, mjJNT_SLIDE)``, and a
MuJoCo 4 enum member does not equal the numpy integer ``model.jnt_type``
holds. Where that is so, the module is given plain-integer joint types as it
is imported (nothing is imported early: the replays check that
gymnasium_robotics is imported only when ``--env`` names it).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types

import numpy as np

PATCHED = "gymnasium_robotics.utils.mujoco_utils"


def _int_joint_types(module) -> None:
    import mujoco

    slide = mujoco.mjtJoint.mjJNT_SLIDE
    if np.int32(int(slide)) in (slide,):
        return  # this MuJoCo compares its enums with numpy integers: nothing to work around
    joints = types.SimpleNamespace(
        **{n: int(getattr(mujoco.mjtJoint, n)) for n in dir(mujoco.mjtJoint) if n.startswith("mjJNT_")}
    )

    class _MuJoCo(types.ModuleType):
        def __getattr__(self, name):
            return getattr(mujoco, name)

    shim = _MuJoCo("mujoco")
    shim.mjtJoint = joints
    module.mujoco = shim


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != PATCHED:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _int_joint_types(module)

        spec.loader.exec_module = exec_and_patch
        return spec


class ReachPolicy:
    """``rollcap.ChunkPolicy`` for FetchReach: move towards the goal, plus noise."""

    chunk_shape = (4, 4)

    def reset(self) -> None:
        self.chunk = None

    def start(self, obs, noise) -> None:
        step = np.clip(10 * (obs["desired_goal"] - obs["achieved_goal"]), -1, 1)
        self.chunk = (np.tile(np.append(step, 0.0), (4, 1)) + 0.1 * noise).astype(np.float32)

    def result(self):
        return self.chunk

    def state_fingerprint(self) -> dict:
        return {"policy": "ReachPolicy"}


def record(out: str, plain: bool) -> None:
    import rollcap

    env_id = "gymnasium_robotics:FetchReach-v4"
    if plain:  # an env object from a plain id, its package imported by the caller
        import gymnasium_robotics  # noqa: F401

        env_id = "FetchReach-v4"
    env = rollcap.make_env(env_id)
    try:
        rollcap.run(1, out=out, env=env, policy=ReachPolicy(), progress=False, max_chunks=3)
    finally:
        env.close()


if __name__ == "__main__":
    sys.meta_path.insert(0, _PatchOnImport())
    if sys.argv[1] == "record":
        record(sys.argv[2], "--plain" in sys.argv[3:])
    else:
        from rollcap.rollout.cli import main

        code = main(sys.argv[2:])
        print(f"imported gymnasium_robotics: {'yes' if 'gymnasium_robotics' in sys.modules else 'no'}", file=sys.stderr)
        sys.exit(code)
