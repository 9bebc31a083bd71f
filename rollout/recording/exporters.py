"""``rollcap.export`` / ``rollcap export``: one door to the exporters (LeRobotDataset v3, Minari, chunk transitions).

Imports point downward: :mod:`.to_lerobot`, :mod:`.to_minari` and :mod:`.to_chunks`.
"""

from __future__ import annotations

import re
from pathlib import Path

TARGETS = ("lerobot", "minari", "chunks")
"""What a recording can be exported to."""


def default_dataset_id(run_dir) -> str:
    """A Minari id for a run directory: ``rollcap/<its name, lower case, [a-z0-9_]>-v0``."""
    name = re.sub(r"[^a-z0-9_]+", "_", Path(run_dir).resolve().name.lower()).strip("_") or "run"
    return f"rollcap/{name}-v0"


def export(run_dir, to: str, root, **options):
    """Export the recording at ``run_dir`` to ``to`` (:data:`TARGETS`) under ``root``; written whole or not at all.

    ``to="lerobot"``: :func:`~rollcap.rollout.recording.to_lerobot.export_lerobot` (``root`` is the dataset
    directory; options ``repo_id``, ``fps``, ``videos``, ``extras``, ``instruction_dims``, ``obs_keys``, ``labels``).
    ``to="minari"``: :func:`~rollcap.rollout.recording.to_minari.export_minari` (``root`` is Minari's datasets
    root, the dataset goes to ``root/<dataset_id>``; options ``dataset_id`` (default :func:`default_dataset_id`),
    ``extras``, ``description``, ``author``, ``author_email``, ``code_permalink``, ``labels``). ``labels="expert"``: the clean scripted expert's action on each
    recorded observation instead of the executed one (:mod:`~rollcap.rollout.recording.labels`).
    ``to="chunks"``: :func:`~rollcap.rollout.recording.to_chunks.export_chunks`, the chunk-level transitions for
    offline RL (``root`` is the new ``.npz``; options ``gamma``, ``obs_keys``; numpy only).

    Returns what was written (``LeRobotExport`` / ``MinariExport`` / ``ChunkExport``).

    Raises:
        ValueError: one line naming the argument (an unknown target, an option the target lacks, bad input).
        ImportError: the target's library is not installed here (the message says how to get it).
    """
    if to == "lerobot":
        from rollcap.rollout.recording.to_lerobot import export_lerobot as fn

        args = (run_dir, root)
    elif to == "chunks":
        from rollcap.rollout.recording.to_chunks import export_chunks as fn

        args = (run_dir, root)
    elif to == "minari":
        from rollcap.rollout.recording.to_minari import export_minari as fn

        options = dict(options)
        args = (run_dir, options.pop("dataset_id", None) or default_dataset_id(run_dir))
        options["root"] = root
    else:
        raise ValueError(f"to: expected one of {', '.join(TARGETS)}, got {to!r}")
    import inspect

    known = set(inspect.signature(fn).parameters) - {"run_dir", "root", "dataset_id"}
    unknown = sorted(set(options) - known - ({"root"} if to == "minari" else set()))
    if unknown:
        raise ValueError(f"{unknown[0]}: not an option of the {to} export (it takes {', '.join(sorted(known))})")
    return fn(*args, **options)
