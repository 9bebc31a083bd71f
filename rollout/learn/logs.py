"""Training logs in TensorBoard's format, for the training examples' ``--tensorboard DIR``.

- :func:`summary_writer`: a ``torch.utils.tensorboard.SummaryWriter`` for a loop of rollcap's own (DSRL-NA,
  REINFORCE), :func:`add_scalars` for a dict of figures at one step.
- :func:`sb3_logger`: Stable-Baselines3's logger printing to stdout (when ``verbose``) and writing TensorBoard event
  files (what SB3's own ``tensorboard_log=`` writes, without the ``/tmp/SB3-<date>`` directory its default makes).

``tensorboard --logdir DIR`` shows them. Needs the ``tensorboard`` package (in the ``rl`` extra); without it, a
``--tensorboard`` is one ImportError naming the install.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

INSTALL = "TensorBoard logging needs the tensorboard package: pip install 'rollcap[rl]'"


def tensorboard_missing() -> str | None:
    """:data:`INSTALL` when the tensorboard package is not importable here, else None (a flag checks it first)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return INSTALL
    return None


def _require_tensorboard() -> None:
    if tensorboard_missing():
        raise ImportError(INSTALL)


def summary_writer(logdir: str | Path):
    """A TensorBoard ``SummaryWriter`` writing event files into ``logdir`` (created)."""
    _require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(logdir))


def add_scalars(writer, prefix: str, values: dict, step: int) -> int:
    """Every finite number in ``values`` as ``prefix/key`` at ``step`` (None, text, NaN: left out); how many."""
    n = 0
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        writer.add_scalar(f"{prefix}/{key}", float(value), step)
        n += 1
    writer.flush()
    return n


def sb3_logger(verbose: bool = True, tensorboard: str | Path | None = None):
    """SB3's ``Logger``: stdout when ``verbose``, TensorBoard event files in ``tensorboard`` when given; no folder of
    its own (``model.set_logger(sb3_logger(...))``)."""
    from stable_baselines3.common.logger import HumanOutputFormat, Logger, TensorBoardOutputFormat

    formats = [HumanOutputFormat(sys.stdout)] if verbose else []
    if tensorboard is not None:
        _require_tensorboard()
        Path(tensorboard).mkdir(parents=True, exist_ok=True)
        formats.append(TensorBoardOutputFormat(str(tensorboard)))
    return Logger(None, formats)
