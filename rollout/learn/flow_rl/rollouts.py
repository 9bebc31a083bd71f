"""The rollout side of a flow-RL run, as the learner drives it: groups on the batched Flow-SDE graph, the held-in
score on a plain graph, both taking new weights in place.

Streams (run seeds; disjoint from each other and from every held-out stream: :data:`RESERVED`):

- training starts: iteration ``i``'s group ``m`` starts from the capsule of ``reset(seed=episode_seed(S, i * M + m))``
  with ``S = TRAIN_SEED_BASE + 100 * seed``;
- training noise: episode ``j`` of the run (unique index) has seed ``episode_seed(S + 50, j)``, so the G members of
  a group differ only in their noise; with ``max_start`` a group starts instead at chunk ``j`` of a scout episode
  from that capsule (the boundary captured exactly), ``j`` drawn from the seed and the iteration;
- held-in: episode 0 of run seed ``HELDIN_SEED_BASE + 1000 * seed + j`` (as DSRL's), the plain sampler on its own noise.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rollcap.rollout.batch import BatchedCore
from rollcap.rollout.build import build, make_env
from rollcap.rollout.config import HostConfig
from rollcap.rollout.groups import Collector, boundary_of, run_slots, start_state
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.learn.dsrl_heldin import HELDIN_SEED_BASE, RESERVED, TRAIN_SEED_BASE, heldin_seeds
from rollcap.rollout.learn.dsrl_eval import Task
from rollcap.rollout.seeding import episode_seed
from rollcap.rollout.spec import Parts, RunConfig, Spec

__all__ = ["GroupRollouts", "HeldInScore", "RESERVED", "streams"]
SCOUT_BASE = 2 * 10**9
"""Scout episodes' indices (``max_start``): apart from the groups' and the continuations'."""


def train_run_seed(seed: int) -> int:
    return TRAIN_SEED_BASE + 100 * int(seed)


def streams(seed: int, heldin_episodes: int, eval_seed: int | None, eval_episodes: int) -> dict:
    """The run's streams, as ``result.json`` names them."""
    s = train_run_seed(seed)
    return {
        "training_starts": {"run_seed": s, "rule": "iteration i's group m starts from reset(seed=episode_seed(run_seed, i x groups + m)), a capsule"},
        "training_noise": {"run_seed": s + 50, "rule": "episode j (unique index) has seed episode_seed(run_seed, j): its noise"},
        "held_in": {"run_seeds": heldin_seeds(seed, heldin_episodes), "episode": 0,
                    "rule": f"{HELDIN_SEED_BASE} + 1000 x seed + j, episode 0 of each; the plain sampler, its own noise"},
        "held_out": None if eval_seed is None else {"run_seed": eval_seed, "episodes": eval_episodes,
                    "rule": "episode_seed(run_seed, i), i < episodes, batch 1: exactly rollcap run --seed run_seed; chosen before training, scored once after it"},
    }  # fmt: skip


def task_parts(task: Task, policy, threads: int, **kw) -> Parts:
    """The task's env with ``policy`` (None: the shipped one for it), no critic."""
    if policy is not None:
        kw["policy"] = policy
    return Parts(env_id=task.env_id, env_kwargs=task.env_kwargs, critic="none", threads=threads, **kw)


class GroupRollouts:
    """``groups`` x ``group_size`` episodes an iteration on one Flow-SDE graph at that batch (see the module docstring).

    :meth:`run` plays iteration ``i`` and returns the collected episodes (group of each) and their ends (records).
    :attr:`runner` takes new weights in place (:meth:`~rollcap.policies.flow_sde.FlowSDERunner.load_weights`).
    """

    def __init__(self, task: Task, policy, groups: int, group_size: int, noise_level: float, seed: int, threads: int = 1,
                 max_start: int = 0):  # fmt: skip
        self.task, self.groups, self.group_size, self.seed = task, groups, group_size, int(seed)
        self.max_start, self.start_chunks = int(max_start), [0] * groups
        self.scout_cost = (0, 0)
        """The last iteration's scouts' chunks and env steps (``max_start``)."""
        parts = task_parts(task, policy, threads, sampler="sde", noise_level=noise_level)
        self.host_config = HostConfig(execute_steps=task.execute_steps, seed=train_run_seed(seed) + 50)
        self.built = build(Spec(parts, self.host_config, RunConfig(envs=groups * group_size)), check_env=False)
        self.runner = self.built.policies[0]
        self.collector = Collector()
        self.core = BatchedCore(self.built.envs, self.runner, None, self.host_config, [self.collector], records=True)
        self.scratch = make_env(task.env_id, task.env_kwargs)

    @property
    def batch(self) -> int:
        return self.groups * self.group_size

    def starts(self, iteration: int) -> list:
        """Iteration ``iteration``'s capsules, one per group: each reset capsule, or (``max_start`` > 0) the boundary
        at chunk ``j`` (drawn in ``0..max_start``) of a scout episode the current policy plays from it."""
        s = train_run_seed(self.seed)
        caps = [start_state(self.scratch, episode_seed(s, iteration * self.groups + m), f"group {iteration}.{m}")
                for m in range(self.groups)]  # fmt: skip
        if not self.max_start:
            return caps
        js = np.random.default_rng([self.seed, 0x5C07, iteration]).integers(0, self.max_start + 1, self.groups)
        need = [m for m in range(self.groups) if js[m] > 0]
        hosts, got = self.core.hosts, {}

        def capture() -> None:  # each scout's boundary j: captured, and the scout stopped there
            for slot, m in enumerate(need):
                h = hosts[slot]
                if slot not in got and h.state is HostState.RUNNING and h.book.chunk == js[m]:
                    got[slot] = boundary_of(h, [float("nan")] * int(js[m]), f"scout {iteration}.{m}")
                    h.events.request_stop("scouted")

        base = SCOUT_BASE + iteration * self.groups
        scouts, _ = self.run(
            [(base + m, episode_seed(self.host_config.seed, base + m), caps[m]) for m in need], capture
        )
        self.scout_cost = (sum(len(e.obs) for e in scouts), sum(e.steps for e in scouts))
        for slot, m in enumerate(need):
            caps[m] = got.get(slot, caps[m])  # a scout that ended before chunk j: its group starts at the reset
        self.start_chunks = [int(c.chunk) for c in caps]
        return caps

    def items(self, iteration: int) -> list[tuple[int, int, object]]:
        """``(index, seed, capsule)`` of every episode of iteration ``iteration``, slot order (group-major)."""
        out = []
        for m, at in enumerate(self.starts(iteration)):
            for g in range(self.group_size):
                index = iteration * self.batch + m * self.group_size + g
                out.append((index, episode_seed(self.host_config.seed, index), at))
        return out

    def branch_seed(self, index: int) -> int:
        """The seed of a continuation episode ``index`` (its noise: the training noise stream's)."""
        return episode_seed(self.host_config.seed, index)

    def run(self, items, on_round=None) -> tuple[list, list]:
        """Play ``items``; returns (the collected episodes in slot order, their ends)."""
        self.collector.take()
        ends = run_slots(self.core, items, on_round)
        kept = self.collector.take()
        return [kept[index] for index, _, _ in items], ends

    def close(self) -> None:
        self.core.close()
        self.built.close()
        self.scratch.close()


class HeldInScore:
    """The held-in stream's episodes on a plain graph at batch ``envs``, the policy's own noise; :meth:`score` plays
    them with the weights the graph holds (:attr:`runner` takes new ones in place)."""

    def __init__(self, task: Task, policy, seed: int, episodes: int, envs: int, threads: int = 1):
        self.seeds = [episode_seed(s, 0) for s in heldin_seeds(seed, episodes)]
        envs = min(envs, episodes)
        parts = task_parts(task, policy, threads)
        config = HostConfig(execute_steps=task.execute_steps)
        self.built = build(Spec(parts, config, RunConfig(envs=envs)), check_env=False)
        self.runner = self.built.policies[0]
        self.core = BatchedCore(self.built.envs, self.runner, None, config, records=False)

    def score(self) -> list[bool]:
        """Each held-in episode's success, in order."""
        ends = {e.index: e.success for e in self.core.episodes(list(enumerate(self.seeds)))}
        return [bool(ends[j]) for j in range(len(self.seeds))]

    def close(self) -> None:
        self.core.close()
        self.built.close()


def with_seed(task: Task, eval_seed: int) -> Task:
    return replace(task, eval_seed=int(eval_seed))


def outcomes(episodes) -> np.ndarray:
    return np.array([e.success for e in episodes], bool)
