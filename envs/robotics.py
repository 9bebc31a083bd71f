"""gymnasium-robotics (Fetch, Shadow hand, ...) under the MuJoCo rollcap installs.

gymnasium-robotics 1.4.2's ``utils.mujoco_utils`` tells joint types apart
with ``model.jnt_type[i] in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)``.
MuJoCo 4's enums compare unequal to a numpy integer that way round
(``mjJNT_SLIDE == np.int32(2)`` is False, ``np.int32(2) == mjJNT_SLIDE``
True), so the assertion fails and no Fetch env can be built.
:func:`fix_joint_types` gives that one module a view of ``mujoco`` whose
joint types are the plain integers MuJoCo defines; every other name is
MuJoCo's own, and nothing numeric changes (the same joints get the same
widths), so recordings made before and after compare as they would.
``rollcap.make_env`` applies it whenever gymnasium-robotics is imported; a
user who builds a Fetch env with ``gym.make`` calls it first.
"""

from __future__ import annotations

import importlib
import sys
import types

MODULE = "gymnasium_robotics.utils.mujoco_utils"


class _IntJointTypes(types.ModuleType):
    """``mujoco`` as gymnasium-robotics' ``mujoco_utils`` sees it: ``mjtJoint`` as plain ints, the rest MuJoCo's own."""

    def __init__(self, mujoco: types.ModuleType):
        super().__init__(mujoco.__name__, mujoco.__doc__)
        self._mujoco = mujoco
        names = (n for n in dir(mujoco.mjtJoint) if n.startswith("mjJNT_"))
        self.mjtJoint = types.SimpleNamespace(**{n: int(getattr(mujoco.mjtJoint, n)) for n in names})

    def __getattr__(self, name: str):
        return getattr(self._mujoco, name)


def joint_types_compare() -> bool:
    """Whether this MuJoCo's joint-type enum equals a numpy integer of its value from either side (MuJoCo < 4)."""
    import mujoco
    import numpy as np

    slide = mujoco.mjtJoint.mjJNT_SLIDE
    return bool(slide == np.int32(int(slide)))


def fix_joint_types() -> bool:
    """Let gymnasium-robotics' ``mujoco_utils`` compare MuJoCo's joint types again (idempotent; process-wide).

    Does nothing when gymnasium-robotics is not importable or this MuJoCo
    compares its enums to numpy integers already. Returns whether the
    module now sees plain-int joint types.
    """
    try:
        utils = sys.modules.get(MODULE) or importlib.import_module(MODULE)
    except ImportError:
        return False
    current = getattr(utils, "mujoco", None)
    if isinstance(current, _IntJointTypes):
        return True
    if current is None or joint_types_compare():
        return False
    utils.mujoco = _IntJointTypes(current)
    return True
