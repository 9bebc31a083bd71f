"""RolloutHost: the steppable episode core every entry point drives.

```
RESET -start()-> RUNNING -(boundary() / execute())*-> STOP_INFER -finish()-> AWAIT_RESET -> RECORD -> RESET
```

An episode is :meth:`RolloutHost.start` -> repeated :meth:`~RolloutHost.boundary`
(write inputs, launch policy and critic on their lanes, wait, ask the stop
predicates) and :meth:`~RolloutHost.execute` (the chunk's actions step by step;
events, interventions and env termination checked every step) ->
:meth:`~RolloutHost.finish`, which returns an :class:`EpisodeEnd`.
:meth:`~RolloutHost.run_episode` is a short driver over these; gymnasium
wrappers, teleop and Ray actors call the steps themselves.

A stop at a boundary means no action of that chunk reaches the env. Start
restores the episode-initial capsule (policy, critic, the host's counters),
taken once at the first start; the simulator is reset from the episode seed and
its exact initial state is emitted. Nothing is rebuilt or recaptured.

:meth:`~RolloutHost.execute` runs the last boundary's chunk in the env, each
step checked for a stop request, a person's intervention (which overrides the
step, and hands back by letting go) and the simulated control clock, and
emitted as a :class:`~rollcap.rollout.protocols.StepEvent`. With real-time
chunking the carried actions run while the next chunk is inferred
(:meth:`~RolloutHost._run_queue`); a branch or a retry starts at another
episode's boundary (:meth:`~RolloutHost._resume`).

An exception from the env, a runner, a predicate or a subscriber's
``on_chunk``/``on_step`` ends the episode with stop reason ``error`` (type and
message kept) and leaves the host ready for the next one; ``on_error`` says
whether such an episode is recorded, dropped, or recorded and re-raised. A
``KeyboardInterrupt`` abandons the episode (nothing recorded) and propagates,
with the host back in RESET.

The host emits events; it keeps no per-step lists. Records are built from the
events by a :class:`~rollcap.rollout.builder.RecordBuilder`.

Single-threaded: drive a host from one thread; other threads talk to it only
through its :class:`EventBus`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np

from rollcap.capsule.verbs import restore, snapshot
from rollcap.envs import exact_state_of, physics_row
from rollcap.envs.adapters import env_name
from rollcap.envs.control import control_period
from rollcap.rollout.episode import ACTOR_AGENT, ACTOR_HUMAN, ACTOR_POLICY
from rollcap.rollout.errors import ConfigError, IllegalTransition
from rollcap.rollout.events import EventBus
from rollcap.rollout.config import HostConfig
from rollcap.rollout.lifecycle import (
    ALLOWED,
    ON_ERROR,
    Bookkeeping,
    EpisodeState,
    HostState,
    Launched,
    checked_noise,
    fingerprints_of,
    jsonable,
)
from rollcap.rollout.predicates import BoundaryView, StopPredicate
from rollcap.rollout.protocols import (
    ChunkCritic,
    ChunkEvent,
    ChunkPolicy,
    EpisodeEnd,
    EpisodeStart,
    Observation,
    StepEvent,
    Subscriber,
    instruction_of,
)
from rollcap.rollout.builder import RecordBuilder
from rollcap.rollout.rtc import ControlClock, configure_policy
from rollcap.rollout.resume import Resume
from rollcap.rollout.seeding import chunk_noise, episode_seed


_STATEFUL = ("live_state", "load_live_state", "state_fingerprint")
_HANDBACK = object()  # _step's signal: the human handed back; end the chunk, not the episode
_EMPTY_ROW = np.zeros(0, np.float64)
_new_launched = tuple.__new__


class RolloutHost:
    """The episode core around one env, one chunk policy and an optional critic.

    Args:
        env: a gymnasium env; a dict observation's ``"instruction"`` is the
            episode's instruction (none: ``""``), and a non-dict observation
            is recorded under the key ``"observation"``. With
            exact state (:func:`rollcap.envs.exact_state_of`) its initial and
            per-step physics states are recorded.
        policy: a :class:`ChunkPolicy` (the captured ``PolicyRunner``, an
            ``ExpertPolicy``, a ``LeRobotPolicy``, yours).
        critic: a :class:`ChunkCritic`, or None: no critic lane, no critic
            predicate, NaN values and no critic fingerprint in the records.
        config: stop rules and seeding.
        subscribers: recorder, progress, metrics, ... (called in order).
        predicates: extra stop predicates (added to the config's).
        events: the mailbox for stop requests, labels and interventions.
        reset_hook: called in AWAIT_RESET (a real robot driver brings the arm
            home, or waits for a key); ``None`` proceeds at once (simulation).
        records: build each episode's :class:`EpisodeRecord` (per-step
            observations included) for ``EpisodeEnd.record`` and recorders;
            False keeps nothing per step (an RL loop that needs outcomes only).
        on_error: an episode ended by an exception is ``"record"``-ed (and the
            run goes on), ``"drop"``-ped (never reaches a recorder), or
            recorded and then re-``"raise"``-d once the host is back in RESET.
    """

    def __init__(
        self,
        env,
        policy: ChunkPolicy,
        critic: ChunkCritic | None = None,
        config: HostConfig | None = None,
        subscribers: Sequence[Subscriber] = (),
        predicates: Sequence[StopPredicate] = (),
        events: EventBus | None = None,
        reset_hook: Callable[[RolloutHost], None] | None = None,
        records: bool = True,
        on_error: str = "record",
    ):
        config = (config or HostConfig()).for_policy(policy)  # resolved now: recordings carry the effective value
        horizon, self.action_dim = (int(n) for n in policy.chunk_shape)
        if config.execute_steps > horizon:
            raise ConfigError(
                "execute_steps", f"the policy's chunks hold {horizon} actions, got {config.execute_steps}"
            )
        if config.critic_threshold is not None and critic is None:
            raise ConfigError("critic_threshold", "is set but the host has no critic")
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error: expected one of {ON_ERROR}, got {on_error!r}")
        subscribers = list(subscribers)
        wanting = [type(s).__name__ for s in subscribers if getattr(s, "wants_records", False)]
        if wanting and not records:
            raise ValueError(f"records=False, but subscribers {wanting} need episode records")
        self.env, self.policy, self.critic, self.config = env, policy, critic, config
        self._chunk_flow = getattr(policy, "chunk_flow", None)  # a stochastic sampler's per-chunk record
        self._knows_finite = hasattr(policy, "chunk_finite")  # True / None after result(): BoundaryView.actions_finite
        configure_policy(policy, config)  # real-time chunking: the policy carries the schedule's prefix
        self.clock = ControlClock(config.control_period_s) if config.control_period_s is not None else None
        self.noise_shape = (horizon, self.action_dim)
        self.subscribers = ([RecordBuilder()] if records else []) + subscribers
        self.predicates = config.predicates() + list(predicates)
        self.events = events or EventBus()
        self.reset_hook, self.on_error = reset_hook, on_error
        self.state = HostState.RESET
        self.book = Bookkeeping()
        self._initial = None
        self._ep: EpisodeState | None = None
        self._launched = False
        self._noise_ahead: tuple[int, int, np.ndarray] | None = (
            None  # (seed, chunk, noise) drawn while the last chunk ran
        )
        self._draw_ahead = False
        self.env_id = env_name(env)
        self.state_env = exact_state_of(env)
        self.components = {
            "host": self.book,
            **{
                n: c
                for n, c in (("policy", policy), ("critic", critic))
                if c is not None and all(callable(getattr(c, m, None)) for m in _STATEFUL)
            },
        }

    # -- state machine -------------------------------------------------------
    def _to(self, new: HostState) -> None:
        if new not in ALLOWED[self.state]:
            raise IllegalTransition(f"host: {self.state.value} -> {new.value} is not a legal transition")
        self.state = new

    def _require(self, state: HostState, what: str) -> None:
        if self.state is not state:
            raise IllegalTransition(f"host: {what} needs state {state.value}, the host is {self.state.value}")

    @property
    def done(self) -> bool:
        """True once the running episode has stopped (call :meth:`finish`)."""
        return self.state is not HostState.RUNNING

    @property
    def obs(self) -> Observation | None:
        """The current observation of the running episode."""
        return None if self._ep is None else self._ep.obs

    # -- the driver ----------------------------------------------------------
    def run(self, episodes: int, start: int = 0) -> list[EpisodeEnd]:
        """Run episodes ``start .. start+episodes-1``; ``on_run_end`` is called however it ends."""
        try:
            return [self.run_episode(i) for i in range(start, start + episodes)]
        finally:
            for s in self.subscribers:
                s.on_run_end()

    def run_episode(self, index: int, seed: int | None = None, at: Resume | None = None) -> EpisodeEnd:
        """One whole episode: :meth:`start`, boundaries and chunks until a stop, :meth:`finish`."""
        self.start(index, seed, at)
        try:
            while self.state is HostState.RUNNING:
                self.boundary()
                if self.state is HostState.RUNNING:
                    self.execute()
        except BaseException:
            self.abort()
            raise
        return self.finish()

    # -- the four steps ------------------------------------------------------
    def start(self, index: int, seed: int | None = None, at: Resume | None = None) -> Observation | None:
        """Begin episode ``index``: restore the initial capsule, reset the env from the episode seed.

        Args:
            at: begin at a chunk boundary of another episode instead (a branch, a retry; see
                :mod:`rollcap.rollout.resume`): after the reset its exact env state is put in place (needs exact state).

        Returns the first observation (None if the episode already ended with an error).
        """
        self._require(HostState.RESET, "start()")
        if at is not None and self.state_env is None:
            raise ConfigError(
                "env_id", f"{self.env_id} has no exact state; an episode cannot start at another's boundary"
            )
        seed = episode_seed(self.config.seed, index) if seed is None else int(seed)
        ep = self._ep = EpisodeState(index, seed, time.perf_counter(), at=at)
        self._to(HostState.RUNNING)
        try:
            self.policy.reset()
            if callable(run_in_caller := getattr(self.policy, "run_in_caller", None)):
                run_in_caller(self.config.chunking == "sync")  # nothing runs between start and result: no hand-off
            if self.critic is not None:
                self.critic.reset()
            if self._initial is None:
                self._initial = snapshot(self.components, label="episode-initial")
            else:
                restore(self._initial, self.components)
            self.book.episode = index
            for p in self.predicates:
                p.reset()
            self.events.clear()
            if self.clock is not None:
                self.clock.reset()
            ep.obs, _ = self.env.reset(seed=seed)
            if at is not None:
                self._resume(at)
            initial_state = self.state_env.get_state() if self.state_env is not None else {}
            start = EpisodeStart(
                index,
                seed,
                instruction_of(ep.obs),
                ep.obs,
                initial_state,
                self.env_id,
                self._env_kwargs(),
                jsonable(dataclasses.asdict(self.config)),
                fingerprints_of(self.policy, self.critic, self.state_env),
                self.noise_shape,
                None if at is None else at.origin,
                control_period(self.env),
            )
        except Exception as err:
            self._fail(err)
            return None
        ep.started = True
        try:
            for s in self.subscribers:
                s.on_episode_start(start)
        except BaseException:
            self.abort()
            raise
        return ep.obs

    def boundary(self, noise: np.ndarray | None = None) -> ChunkEvent | None:
        """One chunk boundary: write inputs, launch policy and critic, wait, ask the predicates.

        Args:
            noise: the flow noise for this chunk, float32 ``(H, A)``; None: the
                episode's own, derived from its seed. A caller's noise (an RL
                agent steering the policy) is recorded like any other, so the
                episode replays exactly.

        Returns the boundary's event, or None when the episode ended instead (an error, or a stop requested
        through the event bus: then nothing is launched). While the bus is paused it waits first. If a
        predicate fired, the episode is stopped and nothing of the chunk will execute; otherwise call
        :meth:`execute` next. With real-time chunking (``config.chunking`` naive / rtc) the previous chunk's
        carried queue executes between the launch and the wait (its step events come before this boundary's
        chunk event, which keeps the launch step and observation; see :mod:`rollcap.rollout.rtc`).
        """
        launched = self.launch(noise)
        return None if launched is None else self.decide(launched)

    def launch(self, noise: np.ndarray | None = None) -> Launched | None:
        """:meth:`boundary`'s first half: write the inputs, start policy and critic; None if the episode ended instead.

        A batched core (:mod:`rollcap.rollout.batch`) launches every slot's host, replays once, then lets each :meth:`decide`.
        """
        if self.state is not HostState.RUNNING:
            self._require(HostState.RUNNING, "boundary()")
        ep = self._ep
        if ep.pending is not None or self._launched:
            raise IllegalTransition("host: boundary() called twice; execute() the last chunk first")
        noise = None if noise is None else checked_noise(noise, self.noise_shape)
        self.events.hold()  # paused: nothing is launched
        stop = self.events.poll_stop()
        if stop is not None:  # ended from outside: no further chunk is launched
            self._stop(stop)
            return None
        self._draw_ahead = False
        try:
            if noise is None and ep.at is not None and ep.at.noise is not None and ep.chunk < len(ep.at.noise):
                noise = np.array(ep.at.noise[ep.chunk], dtype=np.float32)
            elif noise is None:
                ahead, self._noise_ahead = self._noise_ahead, None
                noise = (
                    ahead[2]
                    if ahead is not None and ahead[0] == ep.seed and ahead[1] == ep.chunk
                    else chunk_noise(ep.seed, ep.chunk, self.noise_shape)
                )
                self._draw_ahead = ep.at is None or ep.at.noise is None or ep.chunk + 1 >= len(ep.at.noise)
            carried = self.policy.carried_state() if self.config.chunking != "sync" else None
            queue, obs, step = (self.policy.queue() if carried is not None else ()), ep.obs, ep.steps
            t0 = time.perf_counter()
            # Validate and launch the policy, then the critic: both lanes run at once.
            self.policy.start(ep.obs, noise)
            if self.critic is not None:
                self.critic.start(ep.obs)
        except Exception as err:
            self._fail(err)
            return None
        self._launched = True
        return _new_launched(Launched, (noise, carried, queue, obs, step, t0))  # Launched(...), less its Python __new__

    def draw_ahead(self) -> None:
        """While the lanes run (:meth:`decide` calls it; a batched core for every slot before the wait): the next boundary's own noise."""
        if self._draw_ahead:  # a pure function of seed and chunk
            self._draw_ahead = False
            self._noise_ahead = (
                self._ep.seed,
                self._ep.chunk + 1,
                chunk_noise(self._ep.seed, self._ep.chunk + 1, self.noise_shape),
            )

    def decide(self, launched: Launched) -> ChunkEvent | None:
        """:meth:`boundary`'s second half: wait for the chunk and the value, ask the predicates, emit the event."""
        if self.state is not HostState.RUNNING:
            self._require(HostState.RUNNING, "boundary()")
        if not self._launched:
            raise IllegalTransition("host: decide() needs a launch() first")
        self._launched = False
        ep, (noise, carried, queue, obs, step, t0) = self._ep, launched
        try:
            if self._draw_ahead:  # (a batched core drew it for every slot before the wait)
                self.draw_ahead()
            queue_s = self._run_queue(ep, queue)  # real-time chunking: the carried actions execute meanwhile
            if queue_s is None:
                return None
            t0 += queue_s  # the boundary's latency is what the loop waited, not the queue's steps
            actions = self.policy.result()
            t_policy = time.perf_counter() - t0
            flow = self._chunk_flow() if self._chunk_flow is not None else None
            value = self.critic.result() if self.critic is not None else float("nan")
            t_critic = time.perf_counter() - t0
            k0, t0_steps = (0, 0) if ep.at is None else (ep.at.chunk, ep.at.step)
            view = BoundaryView(
                k0 + ep.chunk, t0_steps + ep.steps, actions, value, time.perf_counter() - ep.t_start,
                self.policy.chunk_finite if self._knows_finite else None,
            )  # fmt: skip
            reason = None
            for p in self.predicates:  # the first to fire
                if (reason := p.check(view)) is not None:
                    break
            boundary_s = time.perf_counter() - t0
            event = ChunkEvent(
                ep.index, ep.chunk, step, obs, noise, actions, value,
                getattr(self.policy, "last_latency_s", t_policy),
                getattr(self.critic, "last_latency_s", t_critic) if self.critic is not None else float("nan"),
                boundary_s, reason, carried, flow,
            )  # fmt: skip
            self.book.chunk += 1
            ep.chunks += 1
            for s in self.subscribers:
                s.on_chunk(event)
        except Exception as err:
            self._fail(err)
            return None
        if reason is not None:
            self._stop(reason)
        else:
            ep.pending = actions
        return event

    def finish(self, reason: str | None = None) -> EpisodeEnd:
        """End the episode and hand it to the subscribers; the host is back in RESET.

        Args:
            reason: when the episode is still running, the caller stops it now with this stop reason (default ``"caller"``).

        Raises:
            The first exception a subscriber's ``on_episode_end`` raised (after every subscriber was called), or,
            with ``on_error="raise"``, the exception that ended the episode.
        """
        if self.state is HostState.RUNNING:
            self._stop(reason or "caller")
        self._require(HostState.STOP_INFER, "finish()")
        ep = self._ep
        self._to(HostState.AWAIT_RESET)
        if self.reset_hook is not None:
            self.reset_hook(self)
        self._to(HostState.RECORD)
        label = self.events.take_label()
        discarded = self.events.take_discard()
        error = None if ep.exception is None else f"{type(ep.exception).__name__}: {ep.exception}"
        end = EpisodeEnd(
            ep.index, ep.seed, ep.stop_reason, bool(ep.success if label is None else label), ep.steps, ep.chunks,
            error=error, exception=ep.exception, dropped=discarded or (ep.exception is not None and self.on_error == "drop"),
        )  # fmt: skip
        failures = []
        if ep.started:
            for s in self.subscribers:
                try:
                    s.on_episode_end(end)
                except Exception as err:  # every subscriber still sees the end
                    failures.append(err)
        self._ep = None
        self._to(HostState.RESET)
        if failures:
            raise failures[0]
        if ep.exception is not None and self.on_error == "raise":
            raise ep.exception
        return end

    def abort(self) -> None:
        """Abandon the running episode (nothing recorded), wait out inference in flight; back to RESET."""
        if self.state in (HostState.RESET, HostState.CLOSED):
            return
        for runner in (self.policy, self.critic):
            if runner is not None:
                runner.reset()
        self._ep = None
        self._launched = False
        self.state = HostState.RESET

    def close(self) -> None:
        """Abandon any running episode and close the runners' lanes and the env."""
        self.abort()
        self._to(HostState.CLOSED)
        for close in [getattr(part, "close", None) for part in (self.policy, self.critic, self.env)]:
            close() if close is not None else None

    # -- private -------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        self._ep.stop_reason = reason
        self._ep.pending = None
        self._launched = False
        self._to(HostState.STOP_INFER)

    def _fail(self, err: Exception) -> None:
        self._ep.exception = err
        self._stop("error")

    # -------------------------------------------------- a chunk's actions, step by step in the env
    def execute(self, actions: np.ndarray | None = None) -> list[StepEvent]:
        """Execute the last boundary's chunk in the env, step by step.

        Args:
            actions: ``None`` executes the policy's chunk (its first ``execute_steps`` actions); an ``[n, A]`` array
                executes those ``n`` actions instead (an outside agent's chunk, recorded as ``ACTOR_AGENT``).
                Interventions still override single steps.

        Returns the steps' events. Stops (env done, success, an event) end the episode at that step; otherwise
        the next call is :meth:`boundary`.
        """
        self._require(HostState.RUNNING, "execute()")
        ep = self._ep
        if ep.pending is None:
            raise IllegalTransition("host: execute() needs a boundary() first")
        chunk, ep.pending = ep.pending, None
        if actions is None:
            todo, actor = chunk[ep.inflight : self.config.execute_steps], ACTOR_POLICY
        else:
            todo, actor = np.asarray(actions), ACTOR_AGENT
            if todo.ndim != 2 or todo.shape[0] < 1 or todo.shape[1] != self.action_dim:
                ep.pending = chunk
                raise ValueError(
                    f"execute(actions): expected an [n, {self.action_dim}] chunk with n >= 1, got shape {todo.shape}"
                )
        out: list[StepEvent] = []
        try:
            for a in todo:
                reason = self._step(ep, a, actor, out)
                if reason is _HANDBACK:  # the human let go: re-plan from the current observation
                    break
                if reason is not None:
                    self._stop(reason)
                    return out
        except Exception as err:
            self._fail(err)
            return out
        ep.chunk += 1
        return out

    def _run_queue(self, ep: EpisodeState, queue) -> float | None:
        """Execute the carried actions while the launched chunk is inferred: the seconds they took (0.0, untimed,
        without any: synchronous chunking), None if the episode stopped meanwhile."""
        ep.inflight = len(queue)
        if not ep.inflight:
            return 0.0
        t0 = time.perf_counter()
        out: list[StepEvent] = []
        for a in queue:
            reason = self._step(ep, a, ACTOR_POLICY, out)
            if reason is not None and reason is not _HANDBACK:
                for runner in (self.policy, self.critic):
                    if runner is not None:
                        runner.reset()  # wait out the launched chunk: the episode ends before it
                self._stop(reason)
                return None
        return time.perf_counter() - t0

    def _step(
        self, ep: EpisodeState, policy_action: np.ndarray, actor: int, out: list[StepEvent]
    ) -> str | object | None:
        while True:
            self.events.hold()  # paused: nothing is stepped
            stop = self.events.poll_stop()
            if stop is not None:
                return stop
            human = self.events.intervention()
            if human is None and ep.human:
                ep.human = False
                return _HANDBACK
            if self.clock is None:
                break
            self.clock.tick()
            if not self.events.paused:  # keys pressed during the tick's wait count before the step begins
                stop = self.events.poll_stop()
                if stop is not None:
                    return stop
                break
            # paused during the wait: hold above, then take the step from the keys of then, at a later tick
        ep.human = human is not None
        action, who = (human, ACTOR_HUMAN) if human is not None else (policy_action, actor)
        state = physics_row(self.state_env.get_state()) if self.state_env is not None else _EMPTY_ROW
        new_obs, reward, terminated, truncated, info = self.env.step(action)
        event = StepEvent(
            ep.index, ep.steps, ep.obs, action, who, state, reward, bool(terminated), bool(truncated), new_obs, info
        )
        ep.obs = new_obs
        ep.steps += 1
        self.book.step += 1
        out.append(event)
        for s in self.subscribers:
            s.on_step(event)
        if info.get("is_success", False):
            ep.success = True
            return "success"
        if terminated:
            return "terminated"
        if truncated:
            return "truncated"
        return None

    def _resume(self, at: Resume) -> None:
        """Put a parent's boundary in place (after the reset): env state, observation, predicate counters."""
        self.state_env.set_state(at.env_state)
        self._ep.obs = at.obs
        self.book.chunk, self.book.step = int(at.chunk), int(at.step)
        blank = np.zeros(self.noise_shape, np.float32)
        for k, value in enumerate(at.prior_values):  # the parent's earlier boundaries, as the predicates saw them
            for p in self.predicates:
                p.check(BoundaryView(k, at.step, blank, value, 0.0))

    def _env_kwargs(self) -> dict:
        return jsonable(dict(getattr(getattr(self.env, "spec", None), "kwargs", {}) or {}))
