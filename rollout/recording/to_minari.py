"""Export a rollcap recording as a Minari dataset (HDF5 storage; no jax needed).

Each episode becomes one Minari episode: ``T + 1`` observations (the recorded
ones and the final one), ``T`` actions, rewards, terminations and
truncations, the episode seed and id; the instruction is an observation
(a ``Text`` space) repeated per step; extras
(:data:`~rollcap.rollout.recording.export.EXTRAS` other than reward and done,
which Minari holds itself) go to ``infos`` as ``T + 1`` rows (the last:
False / NaN). Images are stored raw (``jpeg_encoding=False``): lossless.
``labels="expert"`` stores the clean scripted expert's action on each recorded
observation instead of the executed one (:mod:`.labels`) and says so in the
dataset's description.

Minari keeps datasets under a root directory (``MINARI_DATASETS_PATH``,
default ``~/.minari/datasets``) at ``<root>/<dataset_id>``. The dataset is
written under a temporary root beside that path and renamed into place when
finished: a failure leaves nothing. Minari is imported lazily.

Imports point downward: the recording readers (:mod:`.export`), the labels (:mod:`.labels`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.recording.export import (
    EXTRAS,
    check_extras,
    check_target,
    lazy_import,
    read_run,
    staged,
    step_extras,
    without_empty,
)
from rollcap.rollout.recording.labels import EXPERT_LABELS_NOTE, actions_of, check_labels, expert_for

INSTALL = "pip install minari==0.5.4 (it is in LeRobot's venv: `bash scripts/lerobot_env.sh`)"
MAX_INSTRUCTION = 1024
_INFO_EXTRAS = ("success", "intervention", "critic_value")


@dataclass
class MinariExport:
    """What :func:`export_minari` wrote."""

    path: Path
    """The dataset's directory, ``<root>/<dataset_id>``."""
    dataset_id: str
    root: Path
    """Set ``MINARI_DATASETS_PATH`` to this to ``minari.load_dataset(dataset_id)``."""
    episodes: int
    steps: int
    skipped: list[int] = field(default_factory=list)
    """Indices of recorded episodes with no step (nothing to export)."""


def datasets_root(root=None) -> Path:
    """``root``, else ``MINARI_DATASETS_PATH``, else Minari's default ``~/.minari/datasets``."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def spaces_of(rec: EpisodeRecord):
    """The observation and action spaces of episodes shaped like ``rec``."""
    from gymnasium import spaces

    def box(a: np.ndarray) -> spaces.Box:
        if a.dtype == np.uint8:
            return spaces.Box(0, 255, a.shape[1:], np.uint8)
        if np.issubdtype(a.dtype, np.floating):
            return spaces.Box(-np.inf, np.inf, a.shape[1:], a.dtype)
        raise ValueError(
            f"run_dir: observation has a {a.dtype} array; only uint8 and float arrays can be exported to Minari"
        )

    obs = {k: box(v) for k, v in rec.obs.items()}
    if rec.instruction:
        obs["instruction"] = spaces.Text(MAX_INSTRUCTION, min_length=0, charset=_charset())
    return spaces.Dict(obs), box(rec.steps["actions"])


def _charset() -> str:
    return "".join(map(chr, range(32, 127)))


def export_minari(
    run_dir,
    dataset_id: str,
    *,
    root=None,
    extras: Sequence[str] = EXTRAS,
    description: str | None = None,
    author: str | None = None,
    author_email: str | None = None,
    code_permalink: str | None = None,
    labels: str = "recorded",
) -> MinariExport:
    """Write the episodes at ``run_dir`` as the Minari dataset ``dataset_id`` (``namespace/name-vN``).

    Args:
        run_dir: a rollcap run directory (or one npz / HDF5 recording).
        dataset_id: Minari's id, e.g. ``rollcap/pushblock-v0``.
        root: the datasets root (default: :func:`datasets_root`); ``<root>/<dataset_id>`` must be absent or empty.
        extras: which of :data:`EXTRAS` to add (success, intervention, critic_value go to ``infos``;
            reward and done are Minari's own fields and always present).
        author, author_email, code_permalink: the dataset's metadata, passed to Minari (which
            warns when they are missing: a dataset should say who made it and with what code).
        labels: ``"recorded"`` (the executed actions) or ``"expert"`` (the clean scripted expert's
            action on each recorded observation; the description says so), as for the LeRobot export.

    Raises:
        ValueError: one line naming the argument: not a recording, an existing dataset, a bad id,
            an unknown extra, episodes of different shapes, a recording the expert cannot label.
        ImportError: minari is not installed here.
    """
    extras = check_extras(extras)
    if not isinstance(dataset_id, str) or not dataset_id or os.path.isabs(dataset_id) or ".." in Path(dataset_id).parts:
        raise ValueError(f"dataset_id: expected a Minari id such as 'rollcap/pushblock-v0', got {dataset_id!r}")
    root = datasets_root(root)
    target = root / dataset_id
    check_target(target, "dataset_id")
    check_labels(labels)
    first, records = read_run(run_dir)
    if labels == "expert":
        expert_for(first)
    minari = lazy_import("minari", INSTALL)
    from minari.data_collector import EpisodeBuffer

    obs_space, act_space = spaces_of(first)
    buffers, skipped, steps = [], [], 0
    for rec in without_empty(records, skipped):
        if spaces_of(rec) != (obs_space, act_space):
            raise ValueError(
                f"run_dir: episode {rec.index} has other observation or action shapes than episode {first.index}; export them separately"
            )
        buffers.append(_buffer(EpisodeBuffer, rec, extras, actions_of(rec, labels)))
        steps += rec.num_steps
    if not buffers:
        raise ValueError(f"run_dir: {run_dir} holds no episode with a step")
    description = description or f"rollcap recording {Path(run_dir).resolve()}"
    if labels == "expert":
        description = f"{description}; {EXPERT_LABELS_NOTE}"
    with staged(target, "dataset_id") as out:
        scratch = out.with_name("minari")  # a datasets root beside ``out``, inside the staging directory
        previous = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = str(
            scratch
        )  # Minari reads its root from here only (process-wide: one export at a time)
        try:
            minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=_env_spec(first),
                observation_space=obs_space,
                action_space=act_space,
                algorithm_name="rollcap",
                description=description,
                eval_env=_env_spec(first),  # episodes are evaluated in the env that recorded them
                author=author,
                author_email=author_email,
                code_permalink=code_permalink,
                data_format="hdf5",
                jpeg_encoding=False,
            )
        except (ValueError, AssertionError) as err:  # Minari's own checks of the id and the data
            raise ValueError(
                f"dataset_id: Minari refused {dataset_id!r}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
            ) from err
        finally:
            if previous is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = previous
        os.replace(scratch / dataset_id, out)  # the dataset directory itself is what is published
    return MinariExport(target, dataset_id, root, len(buffers), steps, skipped)


def _env_spec(rec: EpisodeRecord):
    """The recorded env's gymnasium spec with the recorded kwargs (so ``recover_environment()`` works), or None if unregistered."""
    import dataclasses

    import gymnasium
    import rollcap.envs  # noqa: F401  (registers rollcap's own envs)

    try:
        spec = gymnasium.spec(rec.env_id)
    except gymnasium.error.Error:
        return None
    return dataclasses.replace(spec, kwargs={**(spec.kwargs or {}), **(rec.env_kwargs or {})})


def _buffer(EpisodeBuffer, rec: EpisodeRecord, extras: Sequence[str], actions: np.ndarray):
    obs = {k: np.concatenate([v, rec.final_obs[k][None]]) for k, v in rec.obs.items()}
    if rec.instruction:
        obs["instruction"] = [rec.instruction] * (rec.num_steps + 1)
    more = step_extras(rec)
    infos = {}
    for name in extras:
        if name in _INFO_EXTRAS:
            pad = np.array([np.nan if name == "critic_value" else False], dtype=more[name].dtype)
            infos[name] = np.concatenate([more[name], pad])
    return EpisodeBuffer(
        id=rec.index,
        seed=rec.seed,
        observations=obs,
        actions=actions,
        rewards=rec.steps["rewards"],
        terminations=rec.steps["terminated"],
        truncations=rec.steps["truncated"],
        infos=infos,
    )
