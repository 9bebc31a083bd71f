"""Derived seeds and host-side noise: never a global RNG.

``episode_seed(run_seed, i)`` and ``chunk_noise(episode_seed, k, shape)`` are
pure functions, so an episode is the same whichever actor or process runs it.
Noise is float32 standard normal from numpy's PCG64 (recorded in every
episode, so offline replay never depends on regenerating it).
"""

from __future__ import annotations

import numpy as np


def episode_seed(run_seed: int, index: int) -> int:
    """The seed of episode ``index`` of a run (a 63-bit int)."""
    ss = np.random.SeedSequence(entropy=int(run_seed), spawn_key=(0xE915, int(index)))
    return int(ss.generate_state(2, np.uint32).view(np.uint64)[0] >> np.uint64(1))


def chunk_noise(seed: int, chunk: int, shape: tuple[int, ...]) -> np.ndarray:
    """Flow noise for chunk ``chunk`` of the episode with seed ``seed``."""
    rng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(entropy=int(seed), spawn_key=(0x401E, int(chunk))))
    )
    return rng.standard_normal(shape, dtype=np.float32)


def branch_seed(parent_seed: int, chunk: int, branch: int) -> int:
    """The seed of branch ``branch`` (>= 1) from chunk ``chunk`` of the episode with seed ``parent_seed`` (a 63-bit int).

    Its noise is ``chunk_noise(branch_seed, j, shape)`` for the branch's own chunks ``j = 0, 1, ...``.
    """
    ss = np.random.SeedSequence(entropy=int(parent_seed), spawn_key=(0xB4A7, int(chunk), int(branch)))
    return int(ss.generate_state(2, np.uint32).view(np.uint64)[0] >> np.uint64(1))


def retry_seed(parent_seed: int, chunk: int, attempt: int) -> int:
    """The seed of retry ``attempt`` (>= 1) after a live rewind to chunk ``chunk`` of the episode with seed ``parent_seed``."""
    ss = np.random.SeedSequence(entropy=int(parent_seed), spawn_key=(0x5E77, int(chunk), int(attempt)))
    return int(ss.generate_state(2, np.uint32).view(np.uint64)[0] >> np.uint64(1))
