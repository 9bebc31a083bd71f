"""Which actions an exporter writes: the recorded ones, or the clean scripted expert's (DART-style labels).

``labels="recorded"`` (the default) exports what the env received. ``labels="expert"``
exports, for every recorded step, the action the *clean* scripted expert of the
built-in task (:class:`~rollcap.envs.expert.ScriptedExpert` with ``ExpertNoise()``)
takes on that step's recorded observation: demonstrations executed with noise
(``--policy expert:STD``) visit states off the expert's path, and the labels say how
to recover from them (DART: execute noisy, label clean).

The clean expert is a pure function of ``obs["state"]``, the instruction and the
env's geometry (scene, ``max_speed``, control period): its random draws and step
counter only drive the mistakes and give-up of a noisy ``ExpertNoise``, all off
when clean. So the labels are computed from the recording alone. Only recordings
of the built-in task (``rollcap/PushBlock-v0``) with a ``state`` observation and
an instruction can be relabelled; anything else is a ValueError naming ``labels``.

Imports point downward: the episode core, the built-in env and its expert.
"""

from __future__ import annotations

import numpy as np
from rollcap.envs.expert import ExpertNoise, ScriptedExpert
from rollcap.envs.push_block import ENV_ID, PushBlockConfig
from rollcap.envs.scene import parse_instruction
from rollcap.rollout.episode import EpisodeRecord

LABELS = ("recorded", "expert")
"""``recorded``: the actions the env received; ``expert``: the clean scripted expert's action on each recorded observation."""
EXPERT_LABELS_NOTE = "actions relabelled: the clean scripted expert's action (rollcap.envs.expert.ScriptedExpert, no noise) on each recorded observation, not the executed action"
"""What an export with ``labels="expert"`` says about its actions (LeRobot: ``meta/info.json``; Minari: the description)."""


def check_labels(labels: str) -> str:
    """``labels`` if it is one of :data:`LABELS`; a one-line ValueError naming ``labels`` otherwise."""
    if labels not in LABELS:
        raise ValueError(f"labels: expected one of {', '.join(LABELS)}, got {labels!r}")
    return labels


def expert_for(rec: EpisodeRecord) -> ScriptedExpert:
    """The clean scripted expert for the env ``rec`` was recorded in (its geometry, speed and control period).

    Raises:
        ValueError: one line naming ``labels``: not the built-in task, no ``state`` observation, no
            instruction, or env options the expert cannot follow.
    """
    if rec.env_id != ENV_ID:  # a recording keeps rollcap's own ids plain (``rollout.build.OWN_PACKAGES``)
        raise ValueError(
            f"labels: the scripted expert knows only the built-in task {ENV_ID}; episode {rec.index} was recorded in {rec.env_id!r}"
        )
    if "state" not in rec.obs:
        raise ValueError(
            f"labels: episode {rec.index} has no 'state' observation (it has {sorted(rec.obs)}); the expert reads the state"
        )
    try:
        parse_instruction(rec.instruction or "")
    except ValueError:
        raise ValueError(
            f"labels: episode {rec.index} has no instruction of the built-in task (got {rec.instruction!r}); the expert reads it"
        ) from None
    kwargs = dict(rec.env_kwargs or {})
    if "scene" in kwargs:
        raise ValueError(
            f"labels: episode {rec.index} was recorded with a custom scene; the expert follows only the default scene"
        )
    try:
        cfg = PushBlockConfig.with_overrides(**kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"labels: episode {rec.index}'s env_kwargs are not the built-in task's: {str(err).splitlines()[0]}"
        ) from None
    return ScriptedExpert.for_env(cfg, ExpertNoise())


def expert_actions(rec: EpisodeRecord) -> np.ndarray:
    """``[T, 2]`` float32: the clean expert's action on each recorded observation ``rec.obs["state"][t]`` with ``rec.instruction``."""
    expert = expert_for(rec)
    expert.reset(0)  # clean: draws no mistake, so the seed does not matter
    states = rec.obs["state"]
    out = np.empty((rec.num_steps, 2), np.float32)
    for t in range(rec.num_steps):
        out[t] = expert.act({"state": states[t], "instruction": rec.instruction})
    return out


def actions_of(rec: EpisodeRecord, labels: str) -> np.ndarray:
    """The ``[T, A]`` actions to export for ``rec``: recorded, or relabelled by the clean expert (:func:`expert_actions`)."""
    if labels == "expert":
        actions = expert_actions(rec)
        if actions.shape != rec.steps["actions"].shape:
            raise ValueError(
                f"labels: episode {rec.index} has actions of shape {rec.steps['actions'].shape[1:]}; the expert's are (2,)"
            )
        return actions
    return rec.steps["actions"]
