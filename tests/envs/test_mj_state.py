"""set_mj_state: after its mj_forward the integration state (warm start included) reads back exactly as given."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from rollcap.envs import ENV_ID, PushBlockEnv
from rollcap.envs.state import MJ_STATE_SIG, get_mj_state, set_mj_state

ARM = """
<mujoco>
  <worldbody>
    <geom type="plane" size="2 2 .1"/>
    <body pos="0 0 .2">
      <joint name="hinge" type="hinge" axis="0 1 0" limited="true" range="-1 1"/>
      <geom type="capsule" size=".05" fromto="0 0 0 .5 0 0"/>
      <body pos=".5 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0"/>
        <geom type="capsule" size=".05" fromto="0 0 0 .4 0 -.3"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="hinge"/><motor joint="elbow"/></actuator>
</mujoco>
"""


@pytest.fixture
def arm():
    """A small arm with a joint limit and floor contacts, stepped so its warm start and controls are non-zero."""
    model = mujoco.MjModel.from_xml_string(ARM)
    data = mujoco.MjData(model)
    for t in range(40):
        data.ctrl[:] = [np.sin(0.3 * t), -1.0]
        mujoco.mj_step(model, data)
    assert data.nefc > 0 and np.any(data.qacc_warmstart != 0)
    return model, data


def test_integration_state_put_back_after_forward(arm):
    """Whatever mj_forward writes into the integration state is put back (MuJoCo < 3.3.6 writes the warm start).

    On this MuJoCo the only writer mj_forward reaches is a control callback
    (``mjcb_control`` sets ``ctrl``); before 3.3.6 its constraint solver also
    saved ``qacc_warmstart``, which moved Fetch's next step by ~1e-12.
    """
    model, data = arm
    state = get_mj_state(model, data)
    target = mujoco.MjData(model)
    mujoco.set_mjcb_control(lambda m, d: d.ctrl.__setitem__(slice(None), 7.0))
    try:
        set_mj_state(model, target, state)
    finally:
        mujoco.set_mjcb_control(None)
    assert get_mj_state(model, target).tobytes() == state.tobytes()
    assert target.ctrl.tolist() == data.ctrl.tolist()
    assert target.qacc_warmstart.tobytes() == data.qacc_warmstart.tobytes()


def test_restore_derived_arrays_are_the_restored_states(arm):
    """Derived arrays after the restore are mj_forward's of the restored state, not the target's old ones."""
    model, data = arm
    state = get_mj_state(model, data)
    target = mujoco.MjData(model)
    target.qpos[:] = [0.5, -0.5]
    mujoco.mj_forward(model, target)
    set_mj_state(model, target, state)
    expected = mujoco.MjData(model)
    mujoco.mj_setState(model, expected, state, MJ_STATE_SIG)
    mujoco.mj_forward(model, expected)
    assert target.geom_xpos.tobytes() == expected.geom_xpos.tobytes()
    assert target.efc_force.tobytes() == expected.efc_force.tobytes()


def test_pushblock_state_unchanged_by_restore():
    """PushBlock's get_state right after set_state is its state, byte for byte (its layout is unchanged)."""
    env = PushBlockEnv(render_images=False)
    env.reset(seed=2)
    for i in range(12):
        env.step(np.array([np.cos(i), 1.0], np.float32))
    state = env.get_state()
    other = PushBlockEnv(render_images=False)
    other.reset(seed=5)
    other.set_state(state)
    back = other.get_state()
    assert {k: v.tobytes() for k, v in back.items()} == {k: v.tobytes() for k, v in state.items()}
    assert env.state_fingerprint()["env_id"] == ENV_ID
