"""The small interfaces the episode core is built from, and the events it emits.

- :class:`ChunkPolicy`: observation + noise -> an action chunk ``[H, A]``.
- :class:`ChunkCritic`: observation -> a value (optional: a host runs without one).
- :class:`Subscriber`: sees every event, with its data.
- :class:`Env`: the env as the host drives it (a plain ``gymnasium.Env`` is one); its
  exact state, when it has one, is found by :func:`rollcap.envs.exact_state_of`.

Each protocol's docstrings say *when* the host calls a method. Policies and
critics are also capsule components (:class:`rollcap.capsule.Stateful`:
``live_state`` / ``load_live_state`` / ``state_fingerprint``): the host
snapshots them once and restores them at every episode start.

Imports point downward: this module knows ``episode`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rollcap.rollout.episode import EpisodeRecord

Observation = Mapping[str, Any] | np.ndarray
"""What ``env.reset`` / ``env.step`` return: arrays keyed by name plus ``"instruction"`` (str), or one array."""

RAW_OBS_KEY = "observation"
"""The key a non-dict observation is recorded under (and replayed from)."""


def instruction_of(obs: Observation) -> str:
    """The episode instruction an observation carries (``""`` when it carries none)."""
    return str(obs.get("instruction", "")) if isinstance(obs, Mapping) else ""


def recorded_obs(obs: Observation) -> dict[str, Any]:
    """An observation as recordings store it: its arrays by key (no instruction); a plain array under :data:`RAW_OBS_KEY`."""
    if isinstance(obs, Mapping):
        return {k: v for k, v in obs.items() if k != "instruction"}
    return {RAW_OBS_KEY: obs}


def observation_at(record: EpisodeRecord, step: int) -> Observation:
    """The observation the host saw before ``step`` of a recorded episode (``final_obs`` from ``num_steps`` on).

    The inverse of :func:`recorded_obs`: a plain array back as itself, a dict
    with the episode's instruction under ``"instruction"``.
    """
    src = record.final_obs if step >= record.num_steps else {k: v[step] for k, v in record.obs.items()}
    obs = {k: np.asarray(v) for k, v in src.items()}
    if set(obs) == {RAW_OBS_KEY} and not record.instruction:  # the env's observation was one array
        return obs[RAW_OBS_KEY]
    obs["instruction"] = record.instruction
    return obs


@runtime_checkable
class ChunkPolicy(Protocol):
    """Maps an observation and a noise array to an action chunk.

    ``chunk_shape`` is ``(H, A)``: the chunk's horizon and action width (the
    noise has the same shape). Optional members the host uses when present:
    ``execute_steps`` (actions of each chunk executed before the next
    boundary; default H), ``last_latency_s`` (seconds the last inference ran on
    its lane; default: the host's start-to-result time), ``close()``,
    ``run_in_caller(on)`` (at each episode start, ``on`` when chunking is
    synchronous: nothing happens between :meth:`start` and :meth:`result`, so
    the inference may run inside ``result()`` on the host's thread). Real-time
    chunking (``HostConfig.chunking`` naive / rtc) needs a policy that carries
    a prefix: ``configure(delay, execute_steps, guidance, mask)`` (when the
    host is built), ``carried_state()`` and ``queue()`` (before each launch),
    ``load_carried()`` (replay); see :class:`~rollcap.policies.rtc.RTCPolicyRunner`. ``chunk_flow()`` (after
    :meth:`result`): a stochastic sampler's record of the chunk, recorded with it (:attr:`ChunkEvent.flow`).

    Single caller: the host's thread. One inference in flight at a time.
    """

    chunk_shape: tuple[int, int]

    def reset(self) -> None:
        """Called when an episode starts, before its capsule is restored.

        Drop what the last episode left behind, an inference still in flight
        after an error included. Carried state is restored by the capsule.
        """

    def start(self, obs: Observation, noise: np.ndarray) -> None:
        """Called at every chunk boundary: validate ``obs`` and ``noise`` and start inference.

        May return before the chunk is ready (the critic runs meanwhile).
        Raises on bad input before anything is launched.
        """

    def result(self) -> np.ndarray:
        """Called once after :meth:`start`: wait for and return the chunk, float32 ``[H, A]`` (a copy)."""

    def state_fingerprint(self) -> dict:
        """What bit-exactness of the chunk depends on (weights digest, backend, device, ...); JSON-able.

        Recorded with every episode; replay compares it before calling a result exact.
        """


@runtime_checkable
class Env(Protocol):
    """The env as the host drives it: a ``gymnasium.Env`` (what a spec's ``env`` holds when it is not an id).

    Single caller: the host's thread (a batched round's envs step on its threads, one thread an env at a time).
    """

    observation_space: Any
    action_space: Any

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        """Called at every episode start, with the episode's seed."""

    def step(self, action) -> tuple[Observation, float, bool, bool, dict]:
        """Called for every action the host executes: (observation, reward, terminated, truncated, info)."""


@runtime_checkable
class ChunkCritic(Protocol):
    """Maps an observation to a value in [-1, 0] (an estimate of the episode's return).

    Optional: ``last_latency_s`` and ``close()`` as for :class:`ChunkPolicy`.
    Single caller: the host's thread.
    """

    def reset(self) -> None:
        """Called when an episode starts, before its capsule is restored (as :meth:`ChunkPolicy.reset`)."""

    def start(self, obs: Observation) -> None:
        """Called at every chunk boundary, right after the policy's ``start``: validate and start."""

    def result(self) -> float:
        """Called once after :meth:`start`: wait for and return the value."""

    def state_fingerprint(self) -> dict:
        """What bit-exactness of the value depends on; JSON-able."""


# ---------------------------------------------------------------- events


@dataclass(frozen=True)
class EpisodeStart:
    """An episode began: the env was reset and the capsule restored."""

    index: int
    seed: int
    instruction: str
    obs: Observation
    """The first observation (the one the first boundary sees)."""
    initial_state: dict[str, np.ndarray]
    """The env's exact state right after reset (empty without exact state)."""
    env_id: str
    env_kwargs: dict
    config: dict
    """The host config, JSON-able (recorded with the episode)."""
    fingerprints: dict
    """component -> fingerprint (policy, critic when there is one, env when exact)."""
    chunk_shape: tuple[int, int]
    """The policy's ``(H, A)``."""
    origin: dict | None = None
    """Lineage of an episode that began at another's boundary (:class:`~rollcap.rollout.resume.Resume`); None otherwise."""
    control_period_s: float | None = None
    """Simulated seconds one env step covers (:func:`rollcap.envs.control.control_period`); None when the env does not say."""


@dataclass(frozen=True, init=False)
class ChunkEvent:
    """One chunk boundary: what went in, what came out, and the decision.

    Frozen, with a written-out ``__init__``: the generated one of a frozen dataclass sets each field through
    ``object.__setattr__`` (~2.1 us for these 13 on the 2-core box), this one fills the instance dict (~0.7 us); the
    host builds one a slot and boundary (issue 57). The fields, their order and defaults are the dataclass's
    (``tests/rollout/test_protocols.py`` holds the signature to them).
    """

    episode: int
    chunk: int
    step: int
    """Env steps executed before this boundary (the chunk's first step index)."""
    obs: Observation
    noise: np.ndarray
    actions: np.ndarray
    """The raw policy chunk ``[H, A]``."""
    value: float
    """The critic's value (NaN without a critic)."""
    latency_policy_s: float
    latency_critic_s: float
    latency_boundary_s: float
    stop_reason: str | None
    """Set when a stop predicate fired: no action of this chunk reaches the env."""
    carried: dict | None = None
    """Real-time chunking: the policy's carried state this chunk was guided by (``carried`` ``[H, A]``,
    ``carried_w`` ``[H]``, ``carried_n``), taken at launch; None for synchronous chunking."""
    flow: dict | None = None
    """A stochastic sampler's record of the chunk (the policy's ``chunk_flow()``: ``logp [K]``, ``step_noise
    [K, H, A]``, ``trace [K+1, H, A]``; :mod:`rollcap.policies.flow_sde`); None for the other samplers."""

    def __init__(  # noqa: PLR0913 - one argument a field, as the generated __init__
        self, episode: int, chunk: int, step: int, obs: Observation, noise: np.ndarray, actions: np.ndarray,
        value: float, latency_policy_s: float, latency_critic_s: float, latency_boundary_s: float,
        stop_reason: str | None, carried: dict | None = None, flow: dict | None = None,
    ):  # fmt: skip
        fields = self.__dict__  # (frozen: no setattr; one store a line costs less than a tuple unpacked)
        fields["episode"] = episode
        fields["chunk"] = chunk
        fields["step"] = step
        fields["obs"] = obs
        fields["noise"] = noise
        fields["actions"] = actions
        fields["value"] = value
        fields["latency_policy_s"] = latency_policy_s
        fields["latency_critic_s"] = latency_critic_s
        fields["latency_boundary_s"] = latency_boundary_s
        fields["stop_reason"] = stop_reason
        fields["carried"] = carried
        fields["flow"] = flow


@dataclass(frozen=True)
class StepEvent:
    """One env step."""

    episode: int
    step: int
    """Index of this step in the episode (0-based)."""
    obs: Observation
    """The observation the action was chosen on."""
    action: np.ndarray
    """What the env received."""
    actor: int
    """``ACTOR_POLICY``, ``ACTOR_HUMAN`` or ``ACTOR_AGENT`` (see :mod:`rollcap.rollout.episode`)."""
    state: np.ndarray
    """The flat physics state before the step (empty without exact state)."""
    reward: float
    terminated: bool
    truncated: bool
    next_obs: Observation
    info: Mapping[str, Any]


@dataclass
class EpisodeEnd:
    """An episode finished; :meth:`RolloutHost.finish` returns it.

    ``record`` is the full :class:`EpisodeRecord` when the host builds records
    (its default), else None.
    """

    index: int
    seed: int
    stop_reason: str
    success: bool
    num_steps: int
    num_chunks: int
    error: str | None = None
    """``"<Type>: <message>"`` when ``stop_reason`` is ``"error"``."""
    record: EpisodeRecord | None = None
    dropped: bool = False
    """Not to be recorded: discarded by the operator (re-record it), or ended in an error under
    ``on_error="drop"``. No record is built or written."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    """The exception that ended the episode, when one did."""


class Subscriber:
    """Hooks the host calls, in subscriber order; override the ones you need (all optional).

    Order within an episode: ``on_episode_start`` -> (``on_chunk`` -> ``on_step``*)*
    -> ``on_episode_end``; ``on_run_end`` once after :meth:`RolloutHost.run`,
    also when it is interrupted. Hooks run on the host's thread between
    boundaries, so a slow subscriber slows the rollout. Events carry their
    data: a subscriber needs nothing from inside the host. An exception raised
    in ``on_chunk`` / ``on_step`` ends the episode with stop reason ``error``;
    one raised in ``on_episode_start`` / ``on_episode_end`` (a recorder that
    cannot write, say) propagates to the caller after the host is back in RESET.

    A subscriber that sets ``wants_records = True`` is handed the episode's full
    :class:`EpisodeRecord` in ``EpisodeEnd.record``.
    """

    wants_records: bool = False

    def on_episode_start(self, start: EpisodeStart) -> None: ...

    def on_chunk(self, chunk: ChunkEvent) -> None: ...

    def on_step(self, step: StepEvent) -> None: ...

    def on_episode_end(self, end: EpisodeEnd) -> None: ...

    def on_run_end(self) -> None: ...
