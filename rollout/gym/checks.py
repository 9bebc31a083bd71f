"""What the single and vector gymnasium envs share around the episode core: the caller's actions checked, seeds from
entropy, the frame a recorder of videos sees, why a running episode was reset, and a forked worker's torch threads.

Nothing here drives a host; :mod:`~rollcap.rollout.gym.envs` and :mod:`~rollcap.rollout.gym.vector` do.
"""

from __future__ import annotations

import os
import sys
import weakref

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from rollcap.envs.control import control_period
from rollcap.rollout.builder import RecordBuilder

RENDER_MODES = ("rgb_array",)
"""``render_mode`` values the envs take (besides None): ``render()`` returns the image the policy sees."""
TIME_LIMIT = "time_limit"
"""Stop reason of an episode that gymnasium's ``TimeLimit`` truncated (the vector envs' ``max_episode_steps`` too)."""
CALLER_RESET = "reset"
"""Stop reason of an episode the caller reset while it ran (no ``TimeLimit`` had reached its limit)."""

_forked = False


def _after_fork_in_child() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_safe_torch() -> None:
    """Make torch usable on this thread of a process forked from one that had run torch (``AsyncVectorEnv``'s default
    start method on Linux: the parent builds one env to read its spaces, then forks the workers).

    torch's CPU ops run on an OpenMP team: the parent's main thread made one (loading weights, capturing), and after
    ``fork`` this thread still believes it has that team, whose threads do not exist here, so the next parallel op
    (a weight copy) waits on a barrier forever. One intra-op thread on this thread runs torch's ops inline with no
    team. Only this thread's budget changes: the policy and critic replay on their lanes, new threads with their own
    teams and their own budgets. Does nothing in a process that was not forked (a ``spawn`` worker, the main process).
    """
    if _forked:
        import torch  # here: the gym envs' modules import no torch of their own

        torch.set_num_threads(1)


def checked_action(action, shape: tuple[int, ...], what: str = "action") -> np.ndarray:
    """``action`` as float32 of exactly ``shape`` (never reshaped), finite; else ValueError naming what is wrong."""
    a = np.asarray(action)
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: expected shape {tuple(shape)}, got {a.shape} (nothing is reshaped)")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{what}: expected numbers (float32), got dtype {a.dtype}")
    a = a.astype(np.float32, copy=True)
    bad = ~np.isfinite(a)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}: non-finite value {a[where]} at index {where} ({int(bad.sum())} of {a.size})")
    return a


def entropy_seed(rng: np.random.Generator) -> int:
    """A run seed drawn from ``rng`` (the env's ``np_random``: from the OS's entropy unless a seed was given)."""
    return int(rng.integers(0, 2**63 - 1))


def _calling_time_limit(method: str) -> TimeLimit | None:
    """The gymnasium ``TimeLimit`` whose ``method`` (``"step"`` / ``"reset"``) is among the calling frames, or None.

    gymnasium's ``TimeLimit`` truncates by flipping ``truncated`` on its way out and tells the env nothing, so the env
    looks at who called it: a few frames, a few microseconds, once per step (a chunk's step takes milliseconds).
    """
    frame = sys._getframe(2)
    for _ in range(24):
        if frame is None:
            break
        owner = frame.f_locals.get("self") if frame.f_code.co_name == method else None
        if isinstance(owner, TimeLimit):
            return owner
        frame = frame.f_back
    return None


def time_limit_cuts() -> bool:
    """True when a gymnasium ``TimeLimit`` is calling this ``step`` and will truncate the episode on its way out (this
    step is the one that reaches its limit): the env ends the episode itself, stop reason :data:`TIME_LIMIT`, so
    ``stop_reason`` and ``is_success`` are in this step's info, where SB3 and other loggers read them."""
    owner = _calling_time_limit("step")
    return (
        owner is not None and owner._elapsed_steps is not None and owner._elapsed_steps + 1 >= owner._max_episode_steps
    )


def reset_stop_reason(chunks: int) -> str:
    """Why the caller reset an episode that was still running after ``chunks`` steps of the env.

    A reset whose caller is a ``TimeLimit`` whose limit the episode reached is that wrapper's truncation
    (:data:`TIME_LIMIT`: one whose step did not go through it, so :func:`time_limit_cuts` could not end it there); any
    other is the caller's own (:data:`CALLER_RESET`). Looks at the calling frames only.
    """
    owner = _calling_time_limit("reset")
    return TIME_LIMIT if owner is not None and chunks >= owner._max_episode_steps else CALLER_RESET


def frame_key(space: spaces.Space, render_mode: str | None) -> str | None:
    """The observation key ``render()`` shows (the first ``image_*``), or None without a render mode; ValueError for
    a mode the envs do not have, or an env that shows the policy no image."""
    if render_mode is None:
        return None
    if render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode: expected None or one of {list(RENDER_MODES)}, got {render_mode!r}")
    keys = sorted(k for k in getattr(space, "spaces", {}) if k.startswith("image"))
    if not keys:
        raise ValueError("render_mode='rgb_array' shows the image the policy sees, and this env's observation has none")
    return keys[0]


def render_metadata(env: gym.Env, execute_steps: int) -> dict:
    """``metadata`` of an env whose step is a chunk of ``execute_steps`` env steps: ``render_fps`` is chunks per second
    of the env's clock (1 where it has none)."""
    dt = control_period(env)
    return {"render_modes": list(RENDER_MODES), "render_fps": 1.0 if dt is None else 1.0 / (dt * execute_steps)}


def keep_records(host) -> None:
    """A subscriber that wants episode records (a recorder) added to ``host.subscribers`` after the host was made:
    give it records (the host builds them only when one was there at construction). Called between episodes."""
    subs = host.subscribers
    if any(getattr(s, "wants_records", False) for s in subs) and not any(isinstance(s, RecordBuilder) for s in subs):
        subs.insert(0, RecordBuilder())


_next_index: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per recorder (a subscriber that wants records): the next episode index no env has used with it yet."""


def claim_index(own: int, subscribers) -> int:
    """The index of the episode an env starts next: at least ``own`` (the env's next), and past every index used with
    the same recorder by any env in this process (``SyncVectorEnv`` sub-envs sharing one recorder) or already in its
    run directory (``EpisodeRecorder.next_index``: a recorder opened with ``resume=True``). The caller's next is the
    returned index + 1. A recorder used outside the process that opened it refuses here (``check_process``), at the
    episode's start, before anything runs."""
    recorders = [s for s in subscribers if getattr(s, "wants_records", False)]
    for (
        s
    ) in recorders:  # a recorder copied into another process (an AsyncVectorEnv worker) refuses before anything runs
        check = getattr(s, "check_process", None) or getattr(getattr(s, "inner", None), "check_process", None)
        if check is not None:
            check()
    index = max([own, *(_next_index.get(s, getattr(s, "next_index", 0)) for s in recorders)])
    for s in recorders:
        _next_index[s] = index + 1
    return index


def closed_error(what: str) -> gym.error.ClosedEnvironmentError:
    return gym.error.ClosedEnvironmentError(f"{what}: the env is closed; make a new one")
