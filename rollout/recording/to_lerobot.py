"""Export a rollcap recording as a LeRobotDataset v3.

Each episode becomes one LeRobot episode of ``num_steps`` frames: the
observation before each step and the action the env received. Images are
stored losslessly in image mode (PNG in parquet, the default) or as videos
(lossy) with ``videos=True``; the episode's instruction is its task; extras
(:data:`~rollcap.rollout.recording.export.EXTRAS`) become ``next.reward``,
``next.done``, ``next.success``, ``intervention`` and ``critic_value``.
Episodes of zero steps have no frame and are skipped (their indices are returned).
``labels="expert"`` writes the clean scripted expert's action on each recorded
observation instead of the executed one (DART-style demonstrations, :mod:`.labels`)
and says so in ``meta/info.json`` (``"rollcap_labels"``).

The dataset is written into a temporary directory beside ``root`` and renamed
into place when finished: a failure leaves nothing. LeRobot is imported
lazily; it lives in its own environment (``bash scripts/lerobot_env.sh``).

Imports point downward: the recording readers (:mod:`.export`), the labels (:mod:`.labels`), the LeRobot adapter's instruction vector.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rollcap.policies.lerobot_features import INSTRUCTION_FEATURE, instruction_vector, quiet_import_logs
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.recording.export import (
    EXTRAS,
    check_extras,
    check_target,
    frame_rate,
    lazy_import,
    read_run,
    staged,
    step_extras,
    without_empty,
)
from rollcap.rollout.recording.labels import EXPERT_LABELS_NOTE, actions_of, check_labels, expert_for

INSTALL = "LeRobot lives in its own venv: `bash scripts/lerobot_env.sh`, then run with .venv-lerobot/bin/python"
DEFAULT_TASK = "rollcap episode"
"""The task of an episode recorded without an instruction (LeRobot needs one per frame)."""
_EXTRA_FEATURES = {
    "reward": ("next.reward", "float64"),
    "done": ("next.done", "bool"),
    "success": ("next.success", "bool"),
    "intervention": ("intervention", "bool"),
    "critic_value": ("critic_value", "float32"),
}


@dataclass
class LeRobotExport:
    """What :func:`export_lerobot` wrote."""

    root: Path
    repo_id: str
    episodes: int
    frames: int
    features: dict
    fps: int = 0
    """Frames per second written to ``meta/info.json``."""
    fps_source: str = ""
    """Where the rate came from: ``"given"``, ``"recorded"`` (the env's control period at run time) or ``"env"``
    (an older recording's env, built from its recorded id and kwargs)."""
    skipped: list[int] = field(default_factory=list)
    """Indices of recorded episodes with no step (nothing to export)."""


def feature_name(key: str) -> str:
    """The LeRobot feature of a rollcap observation key: ``state`` -> ``observation.state``, ``image_X`` -> ``observation.images.X``."""
    return f"observation.images.{key.removeprefix('image_')}" if key.startswith("image_") else f"observation.{key}"


def features_of(
    rec: EpisodeRecord,
    extras: Sequence[str],
    videos: bool,
    instruction_dims: int = 0,
    obs_keys: Sequence[str] | None = None,
) -> dict:
    """LeRobot features for episodes shaped like ``rec`` (its observation keys ``obs_keys``, default all)."""
    feats = {}
    if instruction_dims:
        feats[INSTRUCTION_FEATURE] = {"dtype": "float32", "shape": (instruction_dims,), "names": None}
    for key, a in rec.obs.items():
        if obs_keys is not None and key not in obs_keys:
            continue
        if key.startswith("image_") and a.dtype == np.uint8 and a.ndim == 4:
            feats[feature_name(key)] = {
                "dtype": "video" if videos else "image",
                "shape": tuple(a.shape[1:]),
                "names": ["height", "width", "channel"],
            }
        else:
            feats[feature_name(key)] = {"dtype": str(a.dtype), "shape": tuple(a.shape[1:]) or (1,), "names": None}
    feats["action"] = {"dtype": "float32", "shape": tuple(rec.steps["actions"].shape[1:]), "names": None}
    for name in extras:
        feature, dtype = _EXTRA_FEATURES[name]
        feats[feature] = {"dtype": dtype, "shape": (1,), "names": None}
    return feats


def export_lerobot(
    run_dir,
    root,
    *,
    repo_id: str | None = None,
    fps: int | None = None,
    videos: bool = False,
    extras: Sequence[str] = EXTRAS,
    instruction_dims: int = 0,
    obs_keys: Sequence[str] | None = None,
    labels: str = "recorded",
) -> LeRobotExport:
    """Write the episodes at ``run_dir`` as a LeRobotDataset v3 at ``root``.

    Args:
        run_dir: a rollcap run directory (or one npz / HDF5 recording).
        root: the dataset directory to create (absent or empty).
        repo_id: the dataset's id (default ``rollcap/<root's name>``); read it back with
            ``LeRobotDataset(repo_id, root=root)``.
        fps: frames per second (default: the recording's control rate, 1 / the env's ``dt`` recorded at run
            time: the built-in task's 10, MetaWorld's 80; for a recording made before rollcap kept it, the rate
            of its env built here from the recorded id and kwargs; refused when neither says).
        videos: store images as videos (lossy, smaller) instead of PNG frames.
        extras: which of :data:`EXTRAS` to add.
        instruction_dims: > 0 also writes the instruction as ``observation.environment_state``,
            a hashed bag of words of that many dims (:func:`~rollcap.policies.lerobot.instruction_vector`),
            for policies without a language input (ACT, Diffusion Policy); ``LeRobotPolicy`` computes
            the same vector from the instruction at run time.
        obs_keys: the observation keys to export (default: all), e.g. ``("state",)`` for a policy without images.
        labels: ``"recorded"`` (the actions the env received) or ``"expert"``: the clean scripted
            expert's action on each recorded observation (:mod:`~rollcap.rollout.recording.labels`;
            DART: demonstrations executed with noise, labelled clean). Only for the built-in task.

    Raises:
        ValueError: one line naming the argument: not a recording, a non-empty ``root``,
            an unknown extra, a rate that is not given and not known, episodes of different shapes, ``labels="expert"`` for a recording
            the expert cannot label.
        ImportError: lerobot is not installed here.
    """
    extras = check_extras(extras)
    root = Path(root)
    check_target(root, "root")
    if fps is not None and (not isinstance(fps, int) or isinstance(fps, bool) or fps < 1):
        raise ValueError(f"fps: expected an integer >= 1, got {fps!r}")
    if not isinstance(instruction_dims, int) or isinstance(instruction_dims, bool) or instruction_dims < 0:
        raise ValueError(f"instruction_dims: expected an integer >= 0, got {instruction_dims!r}")
    check_labels(labels)
    first, records = read_run(run_dir)
    if labels == "expert":
        expert_for(first)  # refuse a recording the expert cannot label before anything is created
    if obs_keys is not None:
        obs_keys = (obs_keys,) if isinstance(obs_keys, str) else tuple(obs_keys)
        missing = [k for k in obs_keys if k not in first.obs]
        if missing or not obs_keys:
            raise ValueError(
                f"obs_keys: {missing[0] if missing else 'empty'!r} is not an observation key of the recording (it has {sorted(first.obs)})"
            )
    fps, fps_source = frame_rate(first, fps, run_dir)
    quiet_import_logs()
    lazy_import("lerobot.datasets", INSTALL)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    repo_id = repo_id or f"rollcap/{root.name}"
    feats = features_of(first, extras, videos, instruction_dims, obs_keys)
    skipped: list[int] = []
    episodes = frames = 0
    with staged(root, "root") as tmp:
        ds = LeRobotDataset.create(repo_id, fps, feats, root=tmp, robot_type=first.env_id, use_videos=videos)
        try:
            for rec in without_empty(records, skipped):
                if features_of(rec, extras, videos, instruction_dims, obs_keys) != feats:
                    raise ValueError(
                        f"run_dir: episode {rec.index} has other observation or action shapes than episode {first.index}; export them separately"
                    )
                if rec.control_period_s != first.control_period_s:
                    raise ValueError(
                        f"run_dir: episode {rec.index} steps every {rec.control_period_s} s, episode {first.index} every {first.control_period_s} s; export them separately"
                    )
                _add_episode(ds, rec, extras, instruction_dims, obs_keys, actions_of(rec, labels))
                episodes, frames = episodes + 1, frames + rec.num_steps
        except BaseException:
            with contextlib.suppress(Exception):  # close its writers; the staged directory is removed anyway
                ds.finalize()
            raise
        ds.finalize()
        if labels == "expert":  # a default export's info.json stays LeRobot's own
            _note_labels(tmp / "meta" / "info.json")
    return LeRobotExport(root, repo_id, episodes, frames, feats, fps, fps_source, skipped)


def _note_labels(info: Path) -> None:
    """Say in the dataset's ``meta/info.json`` that its actions are the expert's (``"rollcap_labels": "expert"`` and a note)."""
    meta = json.loads(info.read_text())
    meta["rollcap_labels"] = "expert"
    meta["rollcap_labels_note"] = EXPERT_LABELS_NOTE
    info.write_text(json.dumps(meta, indent=4))


def _add_episode(
    ds, rec: EpisodeRecord, extras: Sequence[str], instruction_dims: int, obs_keys, actions: np.ndarray
) -> None:
    task = rec.instruction or DEFAULT_TASK
    more = step_extras(rec)
    words = instruction_vector(rec.instruction, instruction_dims) if instruction_dims else None
    for t in range(rec.num_steps):
        frame = {feature_name(k): _value(v[t]) for k, v in rec.obs.items() if obs_keys is None or k in obs_keys}
        if words is not None:
            frame[INSTRUCTION_FEATURE] = words
        frame["action"] = actions[t]
        for name in extras:
            feature, dtype = _EXTRA_FEATURES[name]
            frame[feature] = np.asarray([more[name][t]], dtype=dtype)
        frame["task"] = task
        ds.add_frame(frame)
    ds.save_episode()


def _value(a: np.ndarray) -> np.ndarray:
    return a.reshape(1) if a.ndim == 0 else a
