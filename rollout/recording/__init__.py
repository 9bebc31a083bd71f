"""Recording episodes: one codec, two formats, one recorder.

- :mod:`.codec`: what both formats share (flat array names, the meta, the
  digest, the checks, rebuilding a record from what was read).
- :mod:`.npz`: one ``.npz`` per episode. :mod:`.h5`: one robomimic-layout
  HDF5 per run, appended through the rollback journal of :mod:`.journal`.
- :mod:`.recorder`: :class:`EpisodeRecorder` (a run directory in both
  formats, resumable), :func:`records_equal`, :func:`measure_write_overhead`,
  :func:`synthetic_record`.
- :mod:`.process`: :class:`WriterProcess`, the recorder in a child process
  (episodes cross a pipe as bytes), for rollouts faster than one thread writes.
- :mod:`.runs`: reading any of them back (:func:`load_any`, :func:`iter_any`,
  :func:`episodes_of`, :func:`iter_episodes`).

Imports point downward: codec <- npz, journal <- h5 <- recorder <- process, runs; the package
knows ``kernels.files``, ``episode``, ``errors`` and ``subscribers`` of rollcap.
"""

from __future__ import annotations

from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording.codec import episode_digest
from rollcap.rollout.recording.h5 import H5Writer, recover_h5
from rollcap.rollout.recording.h5read import h5_indices, read_h5, read_h5_episode
from rollcap.rollout.recording.journal import journal_path, pending_journal
from rollcap.rollout.recording.npz import read_npz, write_npz
from rollcap.rollout.recording.process import WriterProcess
from rollcap.rollout.recording.recorder import (
    EPISODES_DIR,
    FORMATS,
    H5_NAME,
    EpisodeRecorder,
    measure_write_overhead,
    records_equal,
    synthetic_record,
)
from rollcap.rollout.recording.runs import episodes_of, iter_any, iter_episodes, load_any

__all__ = [
    "EPISODES_DIR",
    "FORMATS",
    "H5_NAME",
    "CorruptEpisode",
    "EpisodeRecorder",
    "H5Writer",
    "WriterProcess",
    "episode_digest",
    "episodes_of",
    "h5_indices",
    "iter_any",
    "iter_episodes",
    "journal_path",
    "pending_journal",
    "load_any",
    "measure_write_overhead",
    "read_h5",
    "read_h5_episode",
    "read_npz",
    "records_equal",
    "recover_h5",
    "synthetic_record",
    "write_npz",
]
