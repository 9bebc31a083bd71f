"""RolloutHost: the episode state machine around one env, one policy and one critic.

```
RESET -> RUNNING -> STOP_INFER -> AWAIT_RESET -> RECORD -> RESET ...
```

At each chunk boundary in RUNNING the host writes the observation and the
chunk's noise into the static buffers, launches the policy and critic graphs
on their own lanes, waits for both, asks the stop predicates, and only then
executes the chunk in the env step by step (events and env termination are
checked every step). A stop at a boundary means no action of that chunk
reaches the env.

Reset restores the episode-initial capsule (policy and critic buffers and the
host's bookkeeping) taken once at the first reset; the simulator is reset from
the episode seed and its exact initial state is recorded. Nothing is rebuilt
or recaptured.

Single-threaded: drive a host from one thread; other threads talk to it only
through its :class:`EventBus`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rollcap.capsule.verbs import restore, snapshot
from rollcap.rollout.episode import ACTOR_HUMAN, ACTOR_POLICY, CHUNK_DTYPES, STEP_DTYPES, EpisodeRecord
from rollcap.rollout.errors import IllegalTransition
from rollcap.rollout.events import EventBus
from rollcap.rollout.predicates import BoundaryView, CriticBelow, MaxChunks, MaxSeconds, NonFiniteAction, StopPredicate
from rollcap.rollout.seeding import chunk_noise, episode_seed
from rollcap.rollout.subscribers import ChunkInfo, Subscriber


class HostState(enum.Enum):
    RESET = "reset"
    RUNNING = "running"
    STOP_INFER = "stop_infer"
    AWAIT_RESET = "await_reset"
    RECORD = "record"
    CLOSED = "closed"


_ALLOWED = {
    HostState.RESET: {HostState.RUNNING, HostState.CLOSED},
    HostState.RUNNING: {HostState.STOP_INFER},
    HostState.STOP_INFER: {HostState.AWAIT_RESET},
    HostState.AWAIT_RESET: {HostState.RECORD},
    HostState.RECORD: {HostState.RESET},
    HostState.CLOSED: set(),
}


@dataclass(frozen=True)
class HostConfig:
    """When episodes stop, and how the run is seeded."""

    seed: int = 0
    """Run seed; episode i uses ``episode_seed(seed, i)``."""
    critic_threshold: float | None = None
    """Stop when the critic value is below this (None: never)."""
    critic_patience: int = 2
    """... for this many consecutive chunks."""
    max_chunks: int | None = None
    """Stop before this chunk index (None: the env's own time limit)."""
    max_seconds: float | None = None
    """Wall-clock limit per episode (not replay-exact; None: off)."""
    execute_steps: int | None = None
    """Actions of each chunk executed before the next boundary (None: the policy's own setting)."""

    def __post_init__(self):
        if self.execute_steps is not None and self.execute_steps < 1:
            raise ValueError(f"--execute-steps: expected >= 1, got {self.execute_steps}")
        if self.critic_patience < 1:
            raise ValueError(f"--critic-patience: expected >= 1, got {self.critic_patience}")
        if self.max_chunks is not None and self.max_chunks < 1:
            raise ValueError(f"--max-chunks: expected >= 1, got {self.max_chunks}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"--max-seconds: expected > 0, got {self.max_seconds}")
        if self.critic_threshold is not None and not -1.0 <= self.critic_threshold <= 0.0:
            raise ValueError(f"--critic-threshold: values live in [-1, 0], got {self.critic_threshold}")

    @classmethod
    def from_json(cls, data: dict) -> HostConfig:
        """The config a recording was made with (unknown keys from newer versions ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def predicates(self) -> list[StopPredicate]:
        preds: list[StopPredicate] = [NonFiniteAction()]
        if self.max_chunks is not None:
            preds.append(MaxChunks(self.max_chunks))
        if self.max_seconds is not None:
            preds.append(MaxSeconds(self.max_seconds))
        if self.critic_threshold is not None:
            preds.append(CriticBelow(self.critic_threshold, self.critic_patience))
        return preds


class _Bookkeeping:
    """The host's own state as a capsule component (counters)."""

    def __init__(self):
        self.counters = np.zeros(3, dtype=np.int64)  # episode, chunk, step

    def live_state(self) -> dict[str, np.ndarray]:
        return {"counters": self.counters}

    def load_live_state(self, state) -> None:
        self.counters[...] = state["counters"]

    def state_fingerprint(self) -> dict:
        return {"component": "host", "layout": "episode,chunk,step"}


def exact_state_env(env):
    """The outermost layer of ``env``'s wrapper chain with exact state, or None.

    Gymnasium wrappers do not forward attributes, so walk ``.env`` down.
    """
    layer = env
    while layer is not None:
        if callable(getattr(type(layer), "get_state", None)) and getattr(layer, "exact_state", True):
            return layer
        layer = getattr(layer, "env", None)
    return None


def _flat_state(state: dict[str, np.ndarray]) -> np.ndarray:
    """The per-step robomimic ``states`` row: the physics state vector (empty if none)."""
    s = state.get("mj_state")
    return np.zeros(0, np.float64) if s is None else np.asarray(s, dtype=np.float64)


class RolloutHost:
    """Runs episodes of ``env`` with a policy runner and a critic runner.

    Args:
        env: a gymnasium env whose observations carry ``"instruction"``; with
            ``get_state()`` (exact state) its initial state is recorded.
        policy: a :class:`~rollcap.policies.PolicyRunner`.
        critic: a :class:`~rollcap.critics.CriticRunner`.
        config: stop rules and seeding.
        subscribers: recorder, progress, metrics, ... (called in order).
        predicates: extra stop predicates (added to the config's).
        events: the mailbox for stop requests, labels and interventions.
        reset_hook: called in AWAIT_RESET (a real robot driver brings the arm
            home, or waits for a key); ``None`` proceeds at once (simulation).
    """

    def __init__(self, env, policy, critic, config: HostConfig | None = None, subscribers: Sequence[Subscriber] = (), predicates: Sequence[StopPredicate] = (), events: EventBus | None = None, reset_hook: Callable[[RolloutHost], None] | None = None):
        self.env = env
        self.policy = policy
        self.critic = critic
        config = config or HostConfig()
        if config.execute_steps is None:  # resolve now, so recordings carry the effective value
            horizon = policy.noise_shape[1]
            config = dataclasses.replace(config, execute_steps=int(getattr(policy, "execute_steps", horizon)))
        self.config = config
        self.subscribers = list(subscribers)
        self.predicates = self.config.predicates() + list(predicates)
        self.events = events or EventBus()
        self.reset_hook = reset_hook
        self.state = HostState.RESET
        self.book = _Bookkeeping()
        self._initial = None
        self.env_id = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
        self.state_env = exact_state_env(env)
        self.exact_env = self.state_env is not None

    # -- state machine -------------------------------------------------------
    def _to(self, new: HostState) -> None:
        if new not in _ALLOWED[self.state]:
            raise IllegalTransition(f"host: {self.state.value} -> {new.value} is not a legal transition")
        self.state = new

    def _require(self, state: HostState) -> None:
        if self.state is not state:
            raise IllegalTransition(f"host: this needs state {state.value}, the host is {self.state.value}")

    @property
    def components(self) -> dict:
        """The capsule components restored at every reset."""
        return {"policy": self.policy, "critic": self.critic, "host": self.book}

    # -- public --------------------------------------------------------------
    def run(self, episodes: int, start: int = 0) -> list[EpisodeRecord]:
        """Run episodes ``start .. start+episodes-1``; returns their records."""
        out = []
        try:
            for i in range(start, start + episodes):
                out.append(self.run_episode(i))
        finally:
            for s in self.subscribers:
                s.on_run_end()
        return out

    def run_episode(self, index: int, seed: int | None = None) -> EpisodeRecord:
        """One whole episode: RESET -> ... -> RECORD -> RESET."""
        self._require(HostState.RESET)
        seed = episode_seed(self.config.seed, index) if seed is None else int(seed)
        obs, initial_state = self._reset(index, seed)
        self._to(HostState.RUNNING)
        ep = _EpisodeBuffers(self.policy.noise_shape[1:])
        reason, label = self._run_chunks(seed, obs, ep)
        self._to(HostState.STOP_INFER)
        self._to(HostState.AWAIT_RESET)
        if self.reset_hook is not None:
            self.reset_hook(self)
        self._to(HostState.RECORD)
        record = ep.finish(index, seed, self, initial_state, obs["instruction"], reason, label)
        for s in self.subscribers:
            s.on_episode_end(record)
        self._to(HostState.RESET)
        return record

    def close(self) -> None:
        self._to(HostState.CLOSED)
        self.policy.close()
        self.critic.close()
        self.env.close()

    # -- private steps -------------------------------------------------------
    def _reset(self, index: int, seed: int):
        if self._initial is None:
            self._initial = snapshot(self.components, label="episode-initial")
        else:
            restore(self._initial, self.components)
        self.book.counters[0] = index
        for p in self.predicates:
            p.reset()
        self.events.clear()
        obs, _ = self.env.reset(seed=seed)
        initial_state = self.state_env.get_state() if self.exact_env else {}
        for s in self.subscribers:
            s.on_episode_start(index, seed, obs["instruction"])
        return obs, initial_state

    def _run_chunks(self, seed: int, obs, ep: _EpisodeBuffers) -> tuple[str, bool | None]:
        t_start = time.perf_counter()
        index = int(self.book.counters[0])
        chunk = 0
        while True:
            noise = chunk_noise(seed, chunk, ep.noise_shape)
            t0 = time.perf_counter()
            # Validate and write every input before launching either lane, so a bad
            # observation is refused before anything runs.
            self.policy.load(obs, noise)
            self.critic.load(obs)
            self.policy.launch()
            self.critic.launch()
            actions = self.policy.result()
            value = self.critic.result()
            view = BoundaryView(chunk, ep.steps, actions, value, time.perf_counter() - t_start)
            reason = next((r for p in self.predicates if (r := p.check(view)) is not None), None)
            boundary_s = time.perf_counter() - t0
            ep.add_chunk(noise, actions, value, self.policy.last_latency_s, self.critic.last_latency_s, boundary_s)
            self.book.counters[1] += 1
            info = ChunkInfo(index, chunk, value, self.policy.last_latency_s, self.critic.last_latency_s, boundary_s, reason)
            for s in self.subscribers:
                s.on_chunk(info)
            if reason is not None:
                return reason, self.events.take_label()
            for a in actions[: self.config.execute_steps]:
                obs, reason = self._step(obs, a, ep)
                if reason is not None:
                    return reason, self.events.take_label()
            chunk += 1

    def _step(self, obs, policy_action: np.ndarray, ep: _EpisodeBuffers):
        stop = self.events.poll_stop()
        if stop is not None:
            return obs, stop
        human = self.events.intervention()
        action, actor = (human, ACTOR_HUMAN) if human is not None else (policy_action, ACTOR_POLICY)
        state = _flat_state(self.state_env.get_state()) if self.exact_env else np.zeros(0)
        new_obs, reward, terminated, truncated, info = self.env.step(action)
        ep.add_step(obs, action, reward, terminated, truncated, actor, state, new_obs)
        self.book.counters[2] += 1
        for s in self.subscribers:
            s.on_step(ep.steps, float(reward))
        if info.get("is_success", False):
            ep.success = True
            return new_obs, "success"
        if terminated:
            return new_obs, "terminated"
        if truncated:
            return new_obs, "truncated"
        return new_obs, None


class _EpisodeBuffers:
    """Per-episode lists, turned into an :class:`EpisodeRecord` at RECORD."""

    def __init__(self, noise_shape: tuple[int, ...]):
        self.noise_shape = tuple(noise_shape)
        self.obs: dict[str, list] = {}
        self.final_obs: dict | None = None
        self.step_cols: dict[str, list] = {k: [] for k in STEP_DTYPES if k != "dones"}  # dones is derived
        self.chunk_cols: dict[str, list] = {k: [] for k in CHUNK_DTYPES}
        self.success = False

    @property
    def steps(self) -> int:
        return len(self.step_cols["actions"])

    def add_chunk(self, noise, actions, value, lat_p, lat_c, lat_b) -> None:
        c = self.chunk_cols
        c["noise"].append(noise)
        c["policy_chunk"].append(actions)
        c["critic_value"].append(value)
        c["chunk_start"].append(self.steps)
        c["latency_policy_s"].append(lat_p)
        c["latency_critic_s"].append(lat_c)
        c["latency_boundary_s"].append(lat_b)

    def add_step(self, obs, action, reward, terminated, truncated, actor, state, new_obs) -> None:
        for k, v in obs.items():
            if k != "instruction":
                self.obs.setdefault(k, []).append(v)
        s = self.step_cols
        s["actions"].append(np.asarray(action, dtype=np.float32))
        s["rewards"].append(reward)
        s["terminated"].append(terminated)
        s["truncated"].append(truncated)
        s["actor"].append(actor)
        s["states"].append(state)
        self.final_obs = new_obs

    def finish(self, index, seed, host: RolloutHost, initial_state, instruction, reason, label) -> EpisodeRecord:
        t = self.steps
        a_dim = self.noise_shape[-1]
        steps = {}
        for k, rows in self.step_cols.items():
            dt = STEP_DTYPES[k]
            if k == "actions":
                steps[k] = np.asarray(rows, dtype=dt).reshape(t, a_dim)
            elif k == "states":
                width = len(rows[0]) if rows else len(_flat_state(initial_state))
                steps[k] = np.asarray(rows, dtype=dt).reshape(t, width)
            else:
                steps[k] = np.asarray(rows, dtype=dt).reshape(t)
        steps["dones"] = steps["terminated"] | steps["truncated"]
        chunks = {}
        for k, dt in CHUNK_DTYPES.items():
            shape = (len(self.chunk_cols[k]), *self.noise_shape) if k in ("noise", "policy_chunk") else (len(self.chunk_cols[k]),)
            chunks[k] = np.asarray(self.chunk_cols[k], dtype=dt).reshape(shape)
        obs = {k: np.stack(v) for k, v in self.obs.items()}
        final = {k: np.asarray(v) for k, v in (self.final_obs or {}).items() if k != "instruction"}
        fps = {"policy": host.policy.state_fingerprint(), "critic": host.critic.state_fingerprint()}
        if host.exact_env and hasattr(host.state_env, "state_fingerprint"):
            fps["env"] = host.state_env.state_fingerprint()
        env_kwargs = dict(getattr(getattr(host.env, "spec", None), "kwargs", {}) or {})
        record = EpisodeRecord(
            index=index,
            seed=seed,
            env_id=host.env_id,
            env_kwargs=_jsonable(env_kwargs),
            instruction=instruction,
            initial_state={k: np.array(v, copy=True) for k, v in initial_state.items()},
            obs=obs,
            final_obs=final,
            steps=steps,
            chunks=chunks,
            stop_reason=reason,
            success=bool(self.success if label is None else label),
            fingerprints=fps,
            config=_jsonable(dataclasses.asdict(host.config)),
        )
        record.validate()
        return record


def _jsonable(d):
    return json.loads(json.dumps(d, default=lambda o: list(o) if isinstance(o, tuple) else str(o)))
