"""Branch data for DSRL: several chunks from one exactly restored training state, and what each led to.

A vector step's ended episodes restart at *kept boundaries* (a running sub-env's boundary, kept for ``branches``
starts; :meth:`~rollcap.rollout.gym.vector.NoiseSteeringVectorEnv.restart` puts the exact state back), each with
the actor's fresh noise. With ``branch_greedy`` a restarted episode samples its first chunk only and then plays the
actor's deterministic noise, so its return values that chunk under the agent that is evaluated. The restarted
episodes of one boundary form a *group*: their first chunks at one state, and their discounted returns. With
``rank_steps`` the action critic also learns to order a group's chunks by those returns (a pairwise logistic loss,
:meth:`~rollcap.rollout.learn.noise_agent.NoiseAgent.rank_step`): a TD critic regresses values, which at one state
barely differ, while the order is what the actor needs (``scripts/dsrl_rankable.py`` measures both on exact labels).

Imports point downward: numpy and torch only.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

MAX_GROUPS = 4096
"""Groups kept for ranking (the oldest go first)."""


class Branches:
    """The bookkeeping of branch data for ``n`` sub-envs (see the module docstring)."""

    def __init__(self, n: int, branches: int, fraction: float, gamma: float):
        self.branches, self.fraction, self.gamma = int(branches), float(fraction), float(gamma)
        self.kept: list = []  # [Resume, starts left, group], oldest first
        self.phase = np.zeros(n, np.int8)  # 0: an episode started afresh; 1: a restarted one's first chunk; 2: after it
        self.group = np.full(n, -1)  # the group of a restarted episode
        self.first: list = [None] * n  # its first (obs, chunk)
        self.ret, self.steps = np.zeros(n), np.zeros(n, int)
        self.groups: OrderedDict[int, list] = OrderedDict()  # group -> [(obs, chunk, return)], finished episodes
        self.ranked: dict[int, None] = {}  # the groups with two different returns (an ordered set)
        self.next_group = self.restarts = 0

    def greedy(self) -> np.ndarray:
        """The sub-envs past a restarted episode's first chunk (``branch_greedy``: they play the deterministic actor)."""
        return self.phase == 2

    def record(self, i: int, obs: np.ndarray, chunk: np.ndarray, reward: float, done: bool) -> None:
        """Sub-env ``i``'s transition of this step: a restarted episode's return accumulates, and when it ends its
        first chunk joins its group."""
        if self.phase[i] == 0:
            return
        if self.phase[i] == 1:
            self.first[i], self.ret[i], self.steps[i] = (obs, chunk), 0.0, 0
        self.ret[i] += self.gamma ** self.steps[i] * reward
        self.steps[i] += 1
        if done:
            g = int(self.group[i])
            if g not in self.groups and len(self.groups) >= MAX_GROUPS:
                self.ranked.pop(self.groups.popitem(last=False)[0], None)
            members = self.groups.setdefault(g, [])
            members.append((*self.first[i], float(self.ret[i])))
            if len({r for *_, r in members}) > 1:
                self.ranked[g] = None

    def step(self, venv, obs: dict, done: np.ndarray, rng: np.random.Generator) -> list[int]:
        """After a vector step: ended episodes restart at kept boundaries (each with ``fraction``'s odds, oldest
        boundary first; ``obs`` is updated in place); then, while fewer starts are left than sub-envs, one running
        sub-env's boundary is kept for ``branches`` starts. Returns the restarted sub-envs."""
        self.phase[self.phase == 1] = 2
        self.phase[done] = 0
        again = []
        for i in np.flatnonzero(done):
            if self.kept and rng.random() < self.fraction:
                at = self.kept[0]
                o, _ = venv.restart(int(i), at[0])
                at[1] -= 1
                if not at[1]:
                    self.kept.pop(0)
                for k in obs:
                    obs[k][i] = o[k]
                self.phase[i], self.group[i] = 1, at[2]
                again.append(int(i))
        if sum(left for _, left, _ in self.kept) < len(done):
            running = np.flatnonzero(~done)
            if running.size:
                self.kept.append([venv.boundary(int(rng.choice(running))), self.branches, self.next_group])
                self.next_group += 1
        self.restarts += len(again)
        return again

    def pairs(self, rng: np.random.Generator, n: int) -> dict[str, torch.Tensor] | None:
        """Up to ``n`` groups' ordered pairs (the better return first; ties left out), as tensors ``hi_obs``,
        ``hi_action``, ``lo_obs``, ``lo_action``; None while no group has two different returns."""
        if not self.ranked:
            return None
        ranked = list(self.ranked)
        rows: dict[str, list] = {"hi_obs": [], "hi_action": [], "lo_obs": [], "lo_action": []}
        for j in rng.choice(len(ranked), min(n, len(ranked)), replace=False):
            g = self.groups[ranked[j]]
            for x in range(len(g)):
                for y in range(len(g)):
                    if g[x][2] > g[y][2]:
                        for side, (o, a, _) in (("hi", g[x]), ("lo", g[y])):
                            rows[f"{side}_obs"].append(o)
                            rows[f"{side}_action"].append(a)
        return {k: torch.as_tensor(np.stack(v)) for k, v in rows.items()}
