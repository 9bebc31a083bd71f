"""The env side of the episode core: a chunk's actions executed step by step (:class:`Stepping`).

:class:`~rollcap.rollout.host.RolloutHost` is a :class:`Stepping`: its
:meth:`~Stepping.execute` runs the last boundary's chunk in the env, each step
checked for a stop request, a person's intervention (which overrides the
step, and hands back by letting go) and the simulated control clock, and
emitted as a :class:`~rollcap.rollout.protocols.StepEvent`. With real-time
chunking the carried actions run while the next chunk is inferred
(:meth:`~Stepping._run_queue`); a branch or a retry starts at another
episode's boundary (:meth:`~Stepping._resume`). The state machine, the boundaries and the
episode's start and end stay in :mod:`rollcap.rollout.host`.
"""

from __future__ import annotations

import numpy as np

from rollcap.envs import physics_row
from rollcap.rollout.episode import ACTOR_AGENT, ACTOR_HUMAN, ACTOR_POLICY
from rollcap.rollout.errors import IllegalTransition
from rollcap.rollout.lifecycle import EpisodeState, HostState, jsonable
from rollcap.rollout.predicates import BoundaryView
from rollcap.rollout.protocols import StepEvent
from rollcap.rollout.resume import Resume

_HANDBACK = object()  # _step's signal: the human handed back; end the chunk, not the episode
_EMPTY_ROW = np.zeros(0, np.float64)


class Stepping:
    """A host's chunk execution (mixed into :class:`~rollcap.rollout.host.RolloutHost`, whose state it uses)."""

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

    def _run_queue(self, ep: EpisodeState, queue) -> bool:
        """Execute the carried actions while the launched chunk is inferred; True if the episode stopped meanwhile."""
        ep.inflight = len(queue)
        out: list[StepEvent] = []
        for a in queue:
            reason = self._step(ep, a, ACTOR_POLICY, out)
            if reason is not None and reason is not _HANDBACK:
                for runner in (self.policy, self.critic):
                    if runner is not None:
                        runner.reset()  # wait out the launched chunk: the episode ends before it
                self._stop(reason)
                return True
        return False

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
        self.book.counters[2] += 1
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
        self.book.counters[1:] = (at.chunk, at.step)
        blank = np.zeros(self.noise_shape, np.float32)
        for k, value in enumerate(at.prior_values):  # the parent's earlier boundaries, as the predicates saw them
            for p in self.predicates:
                p.check(BoundaryView(k, at.step, blank, value, 0.0))

    def _env_kwargs(self) -> dict:
        return jsonable(dict(getattr(getattr(self.env, "spec", None), "kwargs", {}) or {}))
