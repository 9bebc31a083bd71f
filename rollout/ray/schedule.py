"""The one scheduling loop every Ray source runs on (:class:`Scheduling`, mixed into :class:`~rollcap.rollout.ray.actors.ActorPool`).

:meth:`Scheduling.schedule` runs units of work (a tuple of items each: one
episode, a batched actor's list of episodes, a replay's or a branch's item) as
one call per ready actor at a time, answers coming back as each item ends. It
owns the faults: a dead actor is replaced (:meth:`~Scheduling._replace`), a
replacement that cannot be placed in time is dropped, a failed call's
unanswered items go back to the front of the queue (split as the caller
says: a batched call in halves), an item that fails ``max_tries`` times is
reported in ``failed``, and with no live actor left the rest are.
:meth:`Scheduling.map` is its one-item-per-call form.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace

from rollcap.rollout.ray.connect import say_lost
from rollcap.rollout.ray.episodes import _one_line

MAX_TRIES = 3
"""Tries per episode before it is reported failed (each try that kills its actor costs one)."""


def _episodes(keys: list, most: int = 8) -> str:
    """``episode 3`` / ``episodes 3, 5`` / ``episodes 3, 5, ... (12 in all)``."""
    keys = sorted(keys)
    shown = ", ".join(str(k) for k in keys[:most]) + (f", ... ({len(keys)} in all)" if len(keys) > most else "")
    return f"episode{'s' if len(keys) > 1 else ''} {shown}"


def what_runs_again(again: list, failed: list) -> str:
    """What a lost call's unanswered episodes become, for the lost line: run again, failed (out of tries), or none."""
    parts = [f"{_episodes(again)} run{'s' if len(again) == 1 else ''} again on a live actor"] if again else []
    parts += [f"{_episodes(failed)} failed"] if failed else []
    return ", ".join(parts) or "no episode of its call was left to run"


class Scheduling:
    """The pool's scheduling and fault handling (it uses the pool's ``_ray``, ``slots``, ``failed``, ``retries``,
    ``replaced``, ``dropped``, ``resources``, ``replace_timeout_s`` and ``_new_slot``)."""

    def map(
        self, call, items: Iterable, key=lambda item: item, max_tries: int = MAX_TRIES
    ) -> Iterator[tuple[object, object]]:
        """Run ``call(actor_handle, item)`` (it returns a Ray ref) for every item; yield ``(item, result)`` as each finishes.

        One item per call, on :meth:`schedule` (one call per ready actor at a time, retries, replacements, drops).
        """
        units = ((item,) for item in items)
        return self.schedule(units, lambda handle, unit: call(handle, unit[0]), key, max_tries)

    def schedule(
        self,
        units: Iterable[tuple],
        start,
        key=lambda item: item,
        max_tries: int = MAX_TRIES,
        streaming: bool = False,
        split=None,
    ) -> Iterator[tuple[object, object]]:
        """The one scheduling loop of every Ray source: run each unit (a tuple of items) as one call; yield ``(item, answer)``.

        ``start(actor_handle, unit)`` returns a Ray ref whose value is the unit's one item's answer, or with
        ``streaming`` a streaming generator that yields ``(key(item), answer)`` for each item of the unit as it
        ends (:mod:`rollcap.rollout.ray.batched`). One call per actor at a time, and only on an actor whose
        ``ready()`` has answered. A call that fails (its actor or node died, or the method raised) sends the
        items it had not answered back to the front of the queue for any live actor (``split``: as these units;
        default one unit); a dead actor is replaced, and a replacement that is not ready within
        :attr:`replace_timeout_s` is dropped (one line on stderr). An item in ``max_tries`` failed calls goes
        to :attr:`failed` (by ``key``) with the one-line reason; with no live actor left, so do the items not
        yet run. The next unit is submitted before an answer is yielded, so actors stay busy while the caller
        handles it.
        """
        ray = self._ray
        todo = deque(units)
        tries: dict = {}
        idle = [n for n, s in enumerate(self.slots) if s.live and s.ready is None]
        busy: dict = {}  # a call's ref or generator -> (slot, {key: item} not answered yet)

        def submit() -> None:
            while todo and idle:
                slot, unit = idle.pop(0), todo.popleft()
                busy[start(self.slots[slot].handle, unit)] = (slot, {key(item): item for item in unit})

        def lost(slot: int, left: dict, err: BaseException) -> None:
            if isinstance(err, ray.exceptions.RayActorError):  # the actor process (or its node) died
                # one line naming the node and what runs again (a batched call: every episode it had not answered)
                again = [k for k in left if tries.get(k, 0) + 1 < max_tries]
                say_lost(
                    ray,
                    self.slots[slot].info.get("node"),
                    err,
                    what_runs_again(again, [k for k in left if k not in again]),
                )
                self._replace(slot)
            else:
                idle.append(slot)
            again = []
            for k, item in left.items():
                tries[k] = tries.get(k, 0) + 1
                if tries[k] >= max_tries:
                    self.failed[k] = _one_line(err)
                else:
                    again.append(item)
            if again:
                self.retries += 1
                todo.extendleft(reversed(split(tuple(again)) if split else [tuple(again)]))

        while todo or busy:
            submit()
            starting = {s.ready: n for n, s in enumerate(self.slots) if s.live and s.ready is not None}
            if not busy and not idle and not starting:
                self._no_actors_left([key(item) for unit in todo for item in unit])
                return
            done, _ = ray.wait([*busy, *starting], num_returns=1, timeout=0.5)
            idle += self._poll_starting(starting)
            for ref in done:
                if ref not in busy:
                    continue  # a ready() call: handled by _poll_starting
                slot, left = busy[ref]
                try:
                    k, answer = ray.get(next(ref)) if streaming else (next(iter(left)), ray.get(ref))
                except StopIteration:  # a streaming call is over
                    del busy[ref]
                    if left:  # it ended without answering for these (it should not)
                        lost(slot, left, RuntimeError(f"the actor's call ended without items {sorted(left)}"))
                    else:
                        idle.append(slot)
                    continue
                except ray.exceptions.RayError as err:
                    del busy[ref]
                    lost(slot, left, err)
                    continue
                item = left.pop(k)
                if not streaming:  # its one answer: the call is over
                    del busy[ref]
                    idle.append(slot)
                submit()
                yield item, answer

    def _replace(self, slot: int) -> None:
        """Replace a dead actor (its Ray handle is unusable) with a new one; it gets work once its ``ready()`` answers."""
        self._kill(self.slots[slot].handle)
        self.slots[slot] = self._new_slot()
        self.replaced += 1

    def _poll_starting(self, starting: dict) -> list[int]:
        """The slots among ``starting`` (``ready`` ref -> slot) whose actor is now ready; drop those that failed or timed out."""
        ready = []
        done, _ = self._ray.wait(list(starting), num_returns=len(starting), timeout=0) if starting else ([], [])
        for ref in done:
            slot = self.slots[starting[ref]]
            try:
                slot.info = self._ray.get(ref)
            except self._ray.exceptions.RayError as err:
                self._drop(starting[ref], f"a replacement actor could not start ({_one_line(err)})")
                continue
            slot.ready = None
            self.nodes.add(slot.info["node"])
            ready.append(starting[ref])
        now = time.monotonic()
        for ref, n in starting.items():
            if ref not in done and now - self.slots[n].since > self.replace_timeout_s:
                self._drop(n, f"a replacement actor was not ready within {self.replace_timeout_s:g} s "
                              f"(no node has {self.resources.cpus:g} CPU(s) / {self.resources.gpus:g} GPU(s) free for it)")  # fmt: skip
        return ready

    def _drop(self, slot: int, why: str) -> None:
        self._kill(self.slots[slot].handle)  # a pending one is cancelled: no demand left behind
        self.slots[slot] = replace(self.slots[slot], handle=None, ready=None)
        self.dropped += 1
        live = sum(s.live for s in self.slots)
        print(f"rollcap: {why}; going on with {live} actor(s)", file=sys.stderr)

    def _no_actors_left(self, keys: list) -> None:
        why = f"no live actor left ({self.dropped} dropped)"
        for k in keys:
            self.failed[k] = why
        print(f"rollcap: {why}: {len(keys)} item(s) not run", file=sys.stderr)

    def _kill(self, handle) -> None:
        try:
            self._ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
