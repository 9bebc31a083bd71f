"""The PushBlock scene: geometry, colours, task vocabulary and the MJCF model.

One frozen :class:`SceneSpec` is the single source of truth for the MuJoCo
model (:func:`build_xml`) and for the pure-numpy renderer, so the two draw the
same scene. World frame: the table spans ``[-table_half, table_half]^2`` in
x/y, +x is "right", +y is "away from the robot" (up in the top-down image).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import mujoco

BLOCKS: tuple[str, ...] = ("red", "green", "blue")
"""Block colour names, in state-vector and model order."""

TARGETS: tuple[str, ...] = ("left", "middle", "right")
"""Target names, in model order."""

INSTRUCTION_TEMPLATE = "push the {block} block to the {target} target"
"""The one instruction template; every instruction is this with a block and a target filled in."""

VOCAB: tuple[str, ...] = ("push", "the", "block", "to", "target", *BLOCKS, *TARGETS)
"""Every word an instruction can contain."""

INSTRUCTION_CHARSET = "abcdefghijklmnopqrstuvwxyz "
"""Characters an instruction can contain (the ``Text`` space charset)."""

MAX_INSTRUCTION_LEN = 64
"""Maximum instruction length in characters (and bytes: the charset is ASCII)."""


def make_instruction(block: int, target: int) -> str:
    """Return the instruction for block index ``block`` and target index ``target``."""
    return INSTRUCTION_TEMPLATE.format(block=BLOCKS[block], target=TARGETS[target])


def parse_instruction(text: str) -> tuple[int, int]:
    """Return ``(block, target)`` indices named by an instruction.

    Raises:
        ValueError: the text is not an instruction this task produces.
    """
    for b in range(len(BLOCKS)):
        for t in range(len(TARGETS)):
            if make_instruction(b, t) == text:
                return b, t
    raise ValueError(f"not a PushBlock instruction: {text!r}; expected e.g. {make_instruction(0, 0)!r}")


@dataclass(frozen=True)
class SceneSpec:
    """Geometry and appearance of the PushBlock scene (metres, RGB in [0, 1])."""

    table_half: float = 0.25
    """Half side of the square table."""
    block_radius: float = 0.04
    """Radius (and half height) of each block: a round puck, so a push along the line through
    the pusher's and the puck's centres moves it straight, with no turning or edge-riding."""
    pusher_radius: float = 0.025
    """Radius of the spherical pusher (a disc seen from the top); large blocks and pusher make
    pushing forgiving of centimetre-scale errors."""
    target_radius: float = 0.04
    """Radius of a drawn target zone."""
    target_xy: tuple[tuple[float, float], ...] = ((-0.15, 0.15), (0.0, 0.15), (0.15, 0.15))
    """Target centres, one per name in :data:`TARGETS`."""
    block_rgb: tuple[tuple[float, float, float], ...] = (
        (0.85, 0.15, 0.15),
        (0.15, 0.70, 0.20),
        (0.15, 0.30, 0.85),
    )
    """Block colours, one per name in :data:`BLOCKS`."""
    table_rgb: tuple[float, float, float] = (0.78, 0.72, 0.62)
    """Table colour."""
    target_rgb: tuple[float, float, float] = (0.95, 0.95, 0.92)
    """Target zone colour."""
    pusher_rgb: tuple[float, float, float] = (0.15, 0.15, 0.15)
    """Pusher colour."""
    timestep: float = 0.01
    """Physics timestep in seconds."""
    pusher_friction: float = 0.5
    """Sliding friction of the pusher (MuJoCo takes the larger of two geoms' values)."""
    yaw_damping: float = 0.002
    """Damping of each block's yaw hinge (N m s/rad); larger blocks turn less when pushed off-centre."""

    @property
    def limit(self) -> float:
        """Largest |x| or |y| a block centre can reach (the joint range)."""
        return self.table_half - self.block_radius


def _rgba(rgb: tuple[float, float, float]) -> str:
    return " ".join(f"{c:g}" for c in rgb) + " 1"


def build_xml(spec: SceneSpec, max_speed: float, ortho_attr: str = 'projection="orthographic"') -> str:
    """Return the MJCF of the scene; ``max_speed`` (m/s) is the actuator ctrl range.

    ``ortho_attr`` makes the camera orthographic: MuJoCo >= 3.3 spells it
    ``projection="orthographic"``, older releases ``orthographic="true"``
    (:func:`load_model` picks the one that compiles).

    Blocks move on planar joints (x, y slide + yaw hinge) with joint friction
    standing in for table friction, so there are no block-table contacts; blocks
    are upright cylinders (pucks); the pusher is a sphere on two slide joints
    driven by velocity actuators.
    """
    h, lim, z = spec.block_radius, spec.limit, spec.block_radius
    plim = spec.table_half - spec.pusher_radius
    parts = [
        '<mujoco model="rollcap_push_block">',
        '  <compiler angle="radian" autolimits="true"/>',
        f'  <option timestep="{spec.timestep:g}" integrator="implicitfast"/>',
        '  <visual><quality shadowsize="0" offsamples="0"/>'
        '<global offwidth="512" offheight="512"/>'
        '<headlight ambient="0.3 0.3 0.3" diffuse="0.7 0.7 0.7" specular="0 0 0"/></visual>',
        '  <default><geom friction="0.5 0.005 0.0001" contype="1" conaffinity="1"/></default>',
        "  <worldbody>",
        f'    <camera name="front" pos="0 0 1" xyaxes="1 0 0 0 1 0" {ortho_attr} fovy="{2 * spec.table_half:g}"/>',
        f'    <geom name="table" type="plane" size="{spec.table_half:g} {spec.table_half:g} 0.01"'
        f' rgba="{_rgba(spec.table_rgb)}" contype="0" conaffinity="0"/>',
    ]
    for name, (tx, ty) in zip(TARGETS, spec.target_xy):
        parts.append(
            f'    <geom name="target_{name}" type="cylinder" size="{spec.target_radius:g} 0.0005"'
            f' pos="{tx:g} {ty:g} 0.0005" rgba="{_rgba(spec.target_rgb)}" contype="0" conaffinity="0"/>'
        )
    parts += [
        f'    <body name="pusher" pos="0 0 {z:g}">',
        f'      <joint name="pusher_x" type="slide" axis="1 0 0" range="{-plim:g} {plim:g}"/>',
        f'      <joint name="pusher_y" type="slide" axis="0 1 0" range="{-plim:g} {plim:g}"/>',
        f'      <geom name="pusher" type="sphere" size="{spec.pusher_radius:g}" mass="0.5"'
        f' friction="{spec.pusher_friction:g} 0.005 0.0001" rgba="{_rgba(spec.pusher_rgb)}"/>',
        "    </body>",
    ]
    for name, rgb in zip(BLOCKS, spec.block_rgb):
        parts += [
            f'    <body name="block_{name}" pos="0 0 {z:g}">',
            f'      <joint name="{name}_x" type="slide" axis="1 0 0" range="{-lim:g} {lim:g}"'
            ' damping="0.5" frictionloss="0.3"/>',
            f'      <joint name="{name}_y" type="slide" axis="0 1 0" range="{-lim:g} {lim:g}"'
            ' damping="0.5" frictionloss="0.3"/>',
            f'      <joint name="{name}_yaw" type="hinge" axis="0 0 1" damping="{spec.yaw_damping:g}"'
            ' frictionloss="0.002"/>',
            f'      <geom name="block_{name}" type="cylinder" size="{h:g} {h:g}" mass="0.1" rgba="{_rgba(rgb)}"/>',
            "    </body>",
        ]
    parts += [
        "  </worldbody>",
        "  <actuator>",
        f'    <velocity name="pusher_vx" joint="pusher_x" kv="20" ctrlrange="{-max_speed:g} {max_speed:g}"/>',
        f'    <velocity name="pusher_vy" joint="pusher_y" kv="20" ctrlrange="{-max_speed:g} {max_speed:g}"/>',
        "  </actuator>",
        "</mujoco>",
    ]
    return "\n".join(parts) + "\n"


def load_model(spec: SceneSpec, max_speed: float) -> tuple[mujoco.MjModel, str]:
    """Compile the scene; return the model and the MJCF text it was built from."""
    xml = build_xml(spec, max_speed)
    try:
        return mujoco.MjModel.from_xml_string(xml), xml
    except ValueError as err:
        if "projection" not in str(err):
            raise
    xml = build_xml(spec, max_speed, ortho_attr='orthographic="true"')
    return mujoco.MjModel.from_xml_string(xml), xml


def xml_digest(xml: str) -> bytes:
    """sha256 of the MJCF text (32 bytes)."""
    return hashlib.sha256(xml.encode()).digest()
