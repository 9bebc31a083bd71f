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

The dataset's spaces are the env's own, as Minari's ``DataCollector`` records
them (the bounds of its action and observation boxes, the instruction's
``Text`` space), where the env is registered here and its space describes the
recorded arrays; an env that cannot be made here leaves the spaces the arrays
imply (unbounded boxes). Recorded data outside a declared space (actions the
env clipped) is kept as recorded and counted in one :class:`ExportWarning`, as
is a dataset that names no author, author email or code permalink (Minari's own
three warnings for those, replaced by that one line naming the arguments).

Minari keeps datasets under a root directory (``MINARI_DATASETS_PATH``,
default ``~/.minari/datasets``) at ``<root>/<dataset_id>``. The dataset is
written under a temporary root beside that path and renamed into place when
finished: a failure leaves nothing, not even a directory it made. A relative
root is taken from the working directory. Minari is imported lazily.

Imports point downward: the recording readers (:mod:`.export`), the labels (:mod:`.labels`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rollcap.rollout.episode import EpisodeRecord
from rollcap.rollout.errors import ExportWarning
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
ATTRIBUTION = ("author", "author_email", "code_permalink")
"""The metadata Minari warns about when missing (one warning each); :func:`export_minari` says it in one line."""


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
    outside: dict[str, int] = field(default_factory=dict)
    """Steps whose recorded data lies outside the declared space, by key (``actions``, an observation key)."""


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


def declared_spaces(rec: EpisodeRecord, env) -> tuple:
    """The dataset's spaces for episodes shaped like ``rec``: ``env``'s own where one describes the recorded arrays (the
    same kind, shape and dtype; for the instruction, a ``Text`` space that holds it), else :func:`spaces_of`'s."""
    from gymnasium import spaces

    obs, act = spaces_of(rec)
    if env is None:
        return obs, act

    def fits(mine, inferred) -> bool:
        if isinstance(inferred, spaces.Text):
            return isinstance(mine, spaces.Text) and mine.contains(rec.instruction)
        return isinstance(mine, spaces.Box) and mine.shape == inferred.shape and mine.dtype == inferred.dtype

    theirs = env.observation_space.spaces if isinstance(env.observation_space, spaces.Dict) else {}
    obs = spaces.Dict({k: theirs[k] if k in theirs and fits(theirs[k], v) else v for k, v in obs.spaces.items()})
    return obs, env.action_space if fits(env.action_space, act) else act


def _outside(obs_space, act_space, rec: EpisodeRecord, actions: np.ndarray, counts: dict[str, int]) -> None:
    """Add to ``counts`` the steps of ``rec`` whose actions or observations lie outside the declared boxes."""
    arrays = {"actions": (act_space, actions), **{k: (obs_space[k], v) for k, v in rec.obs.items()}}
    for key, (space, a) in arrays.items():
        if np.isfinite(space.low).any() or np.isfinite(space.high).any():
            flat = a.reshape(len(a), -1)
            out = int(np.count_nonzero(((flat < space.low.ravel()) | (flat > space.high.ravel())).any(axis=1)))
            if out:
                counts[key] = counts.get(key, 0) + out


def _made_env(rec: EpisodeRecord, run_dir):
    """The recorded env, made here as Minari makes it (its spec and spaces go into the dataset); None if unregistered."""
    import gymnasium

    env_spec = _env_spec(rec)
    if env_spec is None:
        return None
    try:
        return gymnasium.make(env_spec)
    except Exception as err:  # noqa: BLE001 - any env's error: Minari would meet it making the env itself
        raise ValueError(
            f"run_dir: {run_dir} was recorded in {rec.env_id}, which cannot be made here ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); Minari records the env a dataset came from"
        ) from err


def _say(outside: dict[str, int], act_space, steps: int, given: dict) -> None:
    """One :class:`ExportWarning` for data outside the declared spaces, one for the attribution Minari misses."""
    if outside:
        where = ", ".join(f"{k} {n}" for k, n in outside.items())
        warnings.warn(
            f"Minari export: steps with data outside the env's space (of {steps}): {where}; kept as recorded, as "
            f"Minari's DataCollector records them (actions: what the env received; it clips them to {act_space})",
            ExportWarning,
            stacklevel=3,
        )
    missing = [name for name in ATTRIBUTION if not given.get(name)]
    if missing:
        warnings.warn(
            f"Minari export: the dataset names no {', '.join(missing)} (Minari recommends them: who made it, with what "
            f"code); rollcap export: {', '.join('--' + m.replace('_', '-') for m in missing)}",
            ExportWarning,
            stacklevel=3,
        )


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
        author, author_email, code_permalink: the dataset's metadata, passed to Minari (a dataset should say who
            made it and with what code: one :class:`ExportWarning` names those missing).
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
    root = datasets_root(root).absolute()  # Minari joins a relative root onto its own paths (it was doubled)
    target = root / dataset_id
    check_target(target, "dataset_id")
    check_labels(labels)
    first, records = read_run(run_dir)
    if labels == "expert":
        expert_for(first)
    minari = lazy_import("minari", INSTALL)
    from gymnasium import spaces
    from minari.data_collector import EpisodeBuffer

    env = _made_env(first, run_dir)
    try:
        shapes = spaces_of(first)
        obs_space, act_space = declared_spaces(first, env)
        buffers, skipped, steps, outside = [], [], 0, {}
        for rec in without_empty(records, skipped):
            if spaces_of(rec) != shapes:
                raise ValueError(
                    f"run_dir: episode {rec.index} has other observation or action shapes than episode {first.index}; export them separately"
                )
            if rec.instruction and not obs_space["instruction"].contains(rec.instruction):
                obs_space = spaces.Dict({**obs_space.spaces, "instruction": shapes[0]["instruction"]})
            actions = actions_of(rec, labels)
            _outside(obs_space, act_space, rec, actions, outside)
            buffers.append(_buffer(EpisodeBuffer, rec, extras, actions))
            steps += rec.num_steps
        if not buffers:
            raise ValueError(f"run_dir: {run_dir} holds no episode with a step")
        description = description or f"rollcap recording {Path(run_dir).resolve()}"
        if labels == "expert":
            description = f"{description}; {EXPERT_LABELS_NOTE}"
        given = {"author": author, "author_email": author_email, "code_permalink": code_permalink}
        kw = dict(observation_space=obs_space, action_space=act_space, description=description, **given)
        _write(minari, target, dataset_id, buffers, env if env is not None else _env_spec(first), _env_spec(first), kw)
    finally:
        if env is not None:
            env.close()
    _say(outside, act_space, steps, given)
    return MinariExport(target, dataset_id, root, len(buffers), steps, skipped, outside)


def _write(minari, target: Path, dataset_id: str, buffers: list, env, eval_env, kw: dict) -> None:
    """Minari writes the dataset under a scratch root beside ``target``; it is renamed into place when whole."""
    with staged(target, "dataset_id") as out:
        scratch = out.with_name("minari")  # a datasets root beside ``out``, inside the staging directory
        previous = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = str(
            scratch
        )  # Minari reads its root from here only (process-wide: one export at a time)
        try:
            with warnings.catch_warnings():  # these three only: export_minari says them in one line
                for name in ATTRIBUTION:
                    warnings.filterwarnings("ignore", f"`{name}` is set to None", UserWarning, "minari")
                minari.create_dataset_from_buffers(
                    dataset_id,
                    buffers,
                    env=env,
                    algorithm_name="rollcap",
                    eval_env=eval_env,  # episodes are evaluated in the env that recorded them
                    data_format="hdf5",
                    jpeg_encoding=False,
                    **kw,
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


def _env_spec(rec: EpisodeRecord):
    """The recorded env's gymnasium spec with the recorded kwargs (so ``recover_environment()`` works), or None if unregistered."""
    import dataclasses

    import gymnasium
    import rollcap.envs  # noqa: F401  (registers rollcap's own envs)

    try:
        env_spec = gymnasium.spec(rec.env_id)
    except gymnasium.error.Error:
        return None
    return dataclasses.replace(env_spec, kwargs={**(env_spec.kwargs or {}), **(rec.env_kwargs or {})})


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
