"""Each chunk's advantage, three ways, and the learner's batch built from them.

- ``grpo`` / ``group`` (GRPO; piRL's and RLinf's ``group_size``): an episode's return (1 on success, else 0, less
  ``chunk_penalty`` a chunk) less its group's mean, over the group's std (``normalize``); every chunk of the
  episode gets it. No critic: the group's mean is the Monte-Carlo value of the capsule it started from.
- ``grpo`` / ``branch`` (VinePPO's idea, Kazemnejad et al. 2024): the same, plus a Monte-Carlo value in mid-episode.
  At one chunk boundary ``j`` of each episode (drawn from the run's seed), ``branch_k`` continuations start from the
  boundary's exact state (:func:`~rollcap.rollout.groups.boundary_of`) with their own noise; their mean success is
  ``V_j``. Chunks before ``j`` get ``V_j - V_0`` (``V_0``: the group's mean), chunks from ``j`` on get ``R - V_j``
  (both over the group's std with ``normalize``). No learned critic anywhere.
- ``ppo``: GAE over an episode's chunks (``gamma``, ``lam``) with a value head (:class:`ValueHead`: an MLP on the
  env's state vector and the task's one-hot) trained on the returns each iteration; advantages normalised over
  the batch.

Chunks whose advantage is 0 (a group whose episodes all ended alike) are left out of the batch: they add nothing
to the loss.
"""

from __future__ import annotations

import numpy as np
import torch

from rollcap.rollout.groups import boundary_of
from rollcap.rollout.lifecycle import HostState
from rollcap.rollout.learn.flow_rl.learner import Batch, ValueHead, gae, group_advantages


class Advantages:
    """The iteration's advantages for :class:`~rollcap.rollout.learn.flow_rl.loop.Trainer` (see the module docstring)."""

    def __init__(self, cfg, spec, task):
        self.cfg, self.spec, self.task = cfg, spec, task
        self.value = self.value_opt = None
        self._code = None
        if cfg.algorithm == "ppo":
            from rollcap.rollout.learn.dsrl import task_code_for

            self._code = task_code_for(task.env_id)
            width = spec.state_dim + (self._code.width if self._code is not None else 0)
            torch.manual_seed(cfg.seed)  # the value head's initial weights: from the run's seed
            self.value = ValueHead(width)
            self.value_opt = torch.optim.Adam(self.value.parameters(), lr=cfg.value_lr)
        self._points: dict[int, object] = {}  # branch: slot -> the Resume captured at its branch chunk
        self._branch_at: list[int] = []
        self._tokens: dict = {}

    def modules(self) -> dict:
        return {"value": self.value} if self.value is not None else {}

    def optimizers(self) -> dict:
        return {"value_opt": self.value_opt} if self.value_opt is not None else {}

    # -- branch points: captured during the iteration's rounds ---------------------------
    def on_round(self, rollouts, iteration: int):
        """A callback for iteration ``iteration``'s rounds that captures each slot's branch boundary (None unless
        ``branch``); slot ``i``'s boundary is drawn in 1..7 from the run's seed and the iteration."""
        if self.cfg.advantage != "branch":
            return None
        n = rollouts.batch
        rng = np.random.default_rng([self.cfg.seed, 0xB7A5, iteration])
        self._branch_at = [int(j) for j in rng.integers(1, 8, n)]
        self._points = {}
        hosts = rollouts.core.hosts

        def capture() -> None:
            for i, h in enumerate(hosts):
                if i not in self._points and h.state is HostState.RUNNING and h.book.chunk == self._branch_at[i]:
                    self._points[i] = boundary_of(h, [float("nan")] * self._branch_at[i], "branch")

        return capture

    def continuations(self, rollouts, iteration: int) -> dict[int, tuple[int, float]] | None:
        """``branch_k`` continuations from every captured branch point: slot -> (branch chunk, mean success)."""
        if self.cfg.advantage != "branch" or not self._points:
            return None
        k, n = self.cfg.branch_k, rollouts.batch
        jobs = [(slot, r) for slot in sorted(self._points) for r in range(k)]
        wins: dict[int, list[bool]] = {slot: [] for slot in self._points}
        base = 10**9 + iteration * n * k  # continuation indices: apart from the groups' (an index names one episode)
        for lo in range(0, len(jobs), n):
            part = jobs[lo : lo + n]
            items = [
                (base + lo + q, rollouts.branch_seed(base + lo + q), self._points[slot])
                for q, (slot, _) in enumerate(part)
            ]
            episodes, _ = rollouts.run(items)
            for (slot, _), e in zip(part, episodes):
                wins[slot].append(bool(e.success))
        self.branch_episodes = len(jobs)
        return {slot: (self._branch_at[slot], float(np.mean(w))) for slot, w in wins.items()}

    # -- the batch ----------------------------------------------------------------------
    def batch(self, episodes, branch=None) -> tuple[Batch | None, dict]:
        """The learner's batch from one iteration's episodes (slot order, group-major), and what it held."""
        cfg = self.cfg
        returns = np.array([float(e.success) - cfg.chunk_penalty * len(e.obs) for e in episodes])
        groups = np.repeat(np.arange(cfg.groups), cfg.group_size)[: len(episodes)]
        info = {"episodes": len(episodes), "success": round(float(np.mean([e.success for e in episodes])), 4),
                "chunks": int(sum(len(e.obs) for e in episodes))}  # fmt: skip
        if cfg.algorithm == "ppo":
            per_chunk = self._gae(episodes)
        elif branch:
            per_chunk = branch_advantages([len(e.obs) for e in episodes], returns, groups, branch, cfg.normalize)
            info["branch_episodes"] = getattr(self, "branch_episodes", 0)
            info["branch_points"] = len(branch)
        else:
            ep_adv = group_advantages(returns, groups, cfg.normalize)
            per_chunk = [np.full(len(e.obs), a, np.float32) for e, a in zip(episodes, ep_adv)]
        rows = [(e, k, a[k]) for e, a in zip(episodes, per_chunk) for k in range(len(e.obs)) if a[k] != 0.0]
        info["trained_chunks"] = len(rows)
        info["informative_groups"] = int(len({int(groups[i]) for i, a in enumerate(per_chunk) if np.any(a != 0)}))
        if not rows:
            return None, info
        images = {k: [] for k in self.spec.image_keys}
        state, tokens, trace, logp, adv = [], [], [], [], []
        for e, k, a in rows:
            values = self.spec.to_inputs(e.obs[k], self._tokens)
            for name in self.spec.image_keys:
                images[name].append(values[name][0])
            state.append(values["state"][0])
            tokens.append(values["tokens"][0])
            trace.append(e.flow[k]["trace"])
            logp.append(e.flow[k]["logp"])
            adv.append(a)
        batch = Batch({k: np.stack(v) for k, v in images.items()}, np.stack(state), np.stack(tokens), np.stack(trace),
                      np.stack(logp), np.asarray(adv, np.float32))  # fmt: skip
        return batch, info

    # -- ppo: GAE with a value head ----------------------------------------------------------
    def _features(self, e) -> np.ndarray:
        rows = []
        for obs in e.obs:
            values = self.spec.to_inputs(obs, self._tokens)
            f = [values["state"][0]]
            if self._code is not None:
                f.append(self._code.encode(values["tokens"][0]))
            rows.append(np.concatenate(f).astype(np.float32))
        return np.stack(rows)

    def _gae(self, episodes) -> list[np.ndarray]:
        cfg = self.cfg
        advs, self._value_rows = [], []
        for e in episodes:
            f = self._features(e)
            with torch.no_grad():
                v = self.value(torch.from_numpy(f)).numpy()
            rewards = np.zeros(len(e.obs), np.float32)
            rewards[-1] = float(e.success)
            rewards -= cfg.chunk_penalty
            last = 0.0 if e.stop_reason in ("success", "terminated") else float(v[-1])  # a time limit: bootstrap
            a, ret = gae(rewards, v, last, cfg.gamma, cfg.lam)
            advs.append(a)
            self._value_rows.append((f, ret))
        flat = np.concatenate(advs)
        mu, sd = float(flat.mean()), float(flat.std()) + 1e-6
        return [((a - mu) / sd).astype(np.float32) for a in advs]

    def update_value(self, episodes) -> dict:
        """PPO: the value head fitted to this iteration's returns (``epochs`` passes); {} otherwise."""
        if self.value is None:
            return {}
        f = torch.from_numpy(np.concatenate([r[0] for r in self._value_rows]))
        y = torch.from_numpy(np.concatenate([r[1] for r in self._value_rows]).astype(np.float32))
        rng = np.random.default_rng([self.cfg.seed, 0x7A1E, len(f)])
        losses = []
        for _ in range(self.cfg.epochs):
            order = rng.permutation(len(f))
            for lo in range(0, len(f), 256):
                idx = torch.from_numpy(order[lo : lo + 256])
                loss = (self.value(f[idx]) - y[idx]).square().mean()
                self.value_opt.zero_grad(set_to_none=True)
                loss.backward()
                self.value_opt.step()
                losses.append(float(loss))
        return {"value_loss": float(np.mean(losses))}


def branch_advantages(lengths, returns, groups, branch: dict, normalize: bool = True) -> list[np.ndarray]:
    """Per-chunk advantages with Monte-Carlo values in mid-episode (see the module docstring): episode ``i`` of
    ``lengths[i]`` chunks, return ``returns[i]``, group ``groups[i]`` (``V_0``: the group's mean return); ``branch[i]``
    = ``(j, V_j)`` where its continuations measured a value (others: ``R - V_0`` for every chunk). With ``normalize``
    all of them are divided by their std over the batch (a group's own std is 0 when it ended alike, while its
    segments need not be)."""
    out = []
    for i, n in enumerate(lengths):
        v0 = float(returns[groups == groups[i]].mean())
        seg = np.full(n, returns[i] - v0, np.float64)
        if i in branch:
            j, v_j = branch[i]
            seg[:j] = v_j - v0
            seg[j:] = returns[i] - v_j
        out.append(seg)
    if normalize:
        flat = np.concatenate(out)
        sd = float(flat[flat != 0].std()) if np.any(flat != 0) else 1.0
        out = [a / (sd + 1e-6) for a in out]
    return [a.astype(np.float32) for a in out]
