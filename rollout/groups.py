"""Groups from one exact state, and continuations from one boundary: what an RL loop asks of the batched core.

- :func:`start_state`: an env reset from a seed, captured as a capsule (its exact state and first observation, a
  :class:`~rollcap.rollout.resume.Resume` at chunk 0). Every episode started at it begins in that state byte for
  byte, whatever its own seed: the env is reset from the episode's seed, then the capsule is restored. So G
  episodes started at one capsule differ only in their noise (each episode's own, from its seed); a re-seed would
  give them one seed, and one noise.
- :func:`boundary_of`: a running episode's chunk boundary now, as a ``Resume`` too (K continuations from it give a
  Monte-Carlo value of that state, with no learned critic).
- :func:`run_slots`: start each slot of a :class:`~rollcap.rollout.batch.BatchedCore` with its ``(index, seed, at)``
  and run rounds (one replay of the batched graph each) until every slot's episode has ended; returns the ends.
- :class:`Collector`: a subscriber that keeps what a learner needs of each chunk (its observation, chunk and the
  sampler's flow record: :attr:`~rollcap.rollout.protocols.ChunkEvent.flow`) and of each episode (reward, outcome,
  the weights it ran with).

Every episode is an ordinary recorded episode with ``origin`` naming its capsule, so it replays on its own.
Imports point downward: ``envs``, ``resume``, ``lifecycle``, ``protocols``; the learner is never imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rollcap.envs import exact_state_of
from rollcap.envs.adapters import env_name
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.protocols import ChunkEvent, EpisodeEnd, EpisodeStart, StepEvent, Subscriber
from rollcap.rollout.resume import Resume


def start_state(env, seed: int, label: str = "group") -> Resume:
    """``env`` reset from ``seed``, as a capsule to start episodes at: its exact state and first observation.

    Raises:
        ConfigError: the env has no exact state (a capsule needs one).
    """
    exact = exact_state_of(env)
    if exact is None:
        name = env_name(env)
        raise ConfigError("env_id", f"{name} has no exact state; a group starts from a capsule of one")
    obs, _ = env.reset(seed=int(seed))
    state = {k: np.array(v, copy=True) for k, v in exact.get_state().items()}
    origin = {"parent": label, "episode": 0, "chunk": 0, "step": 0, "seed": int(seed), "noise": "own"}
    return Resume(state, _copy_obs(obs), 0, 0, origin)


def boundary_of(host, values: Sequence[float], label: str = "live") -> Resume:
    """A running host's chunk boundary now (after its last ``execute``), as a :class:`Resume`: the env's exact state,
    the observation, the chunk and step counts, ``values`` the critic's values at the earlier chunks (NaN without a
    critic; one per chunk, the stop predicates count them).

    Raises:
        ConfigError: the env has no exact state.
        ValueError: the host has no running episode, or ``values`` is not one per earlier chunk.
    """
    if host.state is not HostState.RUNNING:
        raise ValueError(f"boundary_of: the host is {host.state.value}, not running an episode")
    if host.state_env is None:
        raise ConfigError("env_id", f"{host.env_id} has no exact state; a boundary to start at needs one")
    chunk, step = host.book.chunk, host.book.step
    if len(values) != chunk:
        raise ValueError(f"boundary_of: {len(values)} critic values for {chunk} earlier chunks")
    origin = {"parent": label, "episode": host._ep.index, "chunk": chunk, "step": step, "noise": "own",
              "prior_values": [float(v) for v in values]}  # fmt: skip
    state = {k: np.array(v) for k, v in host.state_env.get_state().items()}
    return Resume(state, _copy_obs(host.obs), chunk, step, origin, prior_values=tuple(float(v) for v in values))


def _copy_obs(obs):
    if isinstance(obs, Mapping):
        return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in obs.items()}
    return np.array(obs, copy=True)


def run_slots(
    core, items: Sequence[tuple[int, int, Resume | None]], on_round: Callable[[], None] | None = None
) -> list[EpisodeEnd]:
    """Start slot ``i`` of ``core`` (a :class:`~rollcap.rollout.batch.BatchedCore` whose hosts are all in RESET) with
    ``items[i]`` = ``(index, seed, at)``, then run rounds until every started episode has ended; ``on_round`` is
    called after each round. Returns the ends in slot order. Slots beyond ``len(items)`` stay idle; the batch
    replays them too (their rows keep what they last held and change nothing)."""
    hosts = core.hosts
    if len(items) > len(hosts):
        raise ValueError(f"run_slots: {len(items)} episodes for {len(hosts)} slots")
    if any(h.state is not HostState.RESET for h in hosts):
        raise ValueError("run_slots: every slot must be free (finish or abort their episodes first)")
    core.open_pool()
    try:
        for h, (index, seed, at) in zip(hosts, items):
            h.start(int(index), int(seed), at)
        while any(h.state is HostState.RUNNING for h in hosts):
            core.round()
            if on_round is not None:
                on_round()
        return [h.finish() for h in hosts[: len(items)]]
    except BaseException:
        core.abort()
        raise


@dataclass
class Episode:
    """What a :class:`Collector` kept of one episode."""

    index: int
    seed: int
    origin: dict | None
    weights: str
    """The policy's weights digest at the episode's start (its fingerprint's ``weights_digest``)."""
    obs: list = field(default_factory=list)
    """Each chunk's observation (the boundary's)."""
    actions: list = field(default_factory=list)
    flow: list = field(default_factory=list)
    """Each chunk's :attr:`ChunkEvent.flow` (None for a sampler without one)."""
    values: list = field(default_factory=list)
    chunk_rewards: list = field(default_factory=list)
    """The env's reward summed over each chunk's steps."""
    success: bool = False
    stop_reason: str = ""
    steps: int = 0


class Collector(Subscriber):
    """Keeps each episode's chunks and outcome (see :class:`Episode`), by episode index; thread-safe.

    ``episodes`` is filled as episodes run; take them with :meth:`take` (and clear).
    """

    def __init__(self):
        self.episodes: dict[int, Episode] = {}
        self._lock = threading.Lock()

    def on_episode_start(self, start: EpisodeStart) -> None:
        fp = (start.fingerprints or {}).get("policy") or {}
        with self._lock:
            self.episodes[start.index] = Episode(
                start.index, start.seed, start.origin, str(fp.get("weights_digest", ""))
            )

    def on_chunk(self, chunk: ChunkEvent) -> None:
        with self._lock:
            ep = self.episodes[chunk.episode]
            ep.obs.append(chunk.obs)
            ep.actions.append(chunk.actions)
            ep.flow.append(chunk.flow)
            ep.values.append(chunk.value)
            ep.chunk_rewards.append(0.0)

    def on_step(self, step: StepEvent) -> None:
        with self._lock:
            ep = self.episodes[step.episode]
            if ep.chunk_rewards:
                ep.chunk_rewards[-1] += float(step.reward)
            ep.steps += 1

    def on_episode_end(self, end: EpisodeEnd) -> None:
        with self._lock:
            ep = self.episodes.get(end.index)
            if ep is not None:
                ep.success, ep.stop_reason = bool(end.success), end.stop_reason

    def take(self) -> dict[int, Episode]:
        """The episodes kept so far (and forget them)."""
        with self._lock:
            out, self.episodes = self.episodes, {}
        return out
