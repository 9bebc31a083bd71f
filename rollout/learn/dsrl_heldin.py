"""DSRL's held-in stream and keep-best: score the agent during training, keep the best one, say which was kept.

Three streams of run seeds, disjoint by construction (:func:`streams` names them in ``result.json``):

- training: sub-env ``i`` of training seed ``s`` uses run seed ``TRAIN_SEED_BASE + 100 * s + i``;
- held-in: episode ``j`` of training seed ``s`` is episode 0 of run seed ``HELDIN_SEED_BASE + 1000 * s + j``;
- held-out: episodes ``0..N-1`` of one run seed outside both ranges (the task's, or ``--eval-seed``), scored once,
  after training, on the kept agent.

:class:`HeldIn` plays the same held-in episodes (a vector env of its own, batch ``envs``, in rounds) with any noise
rule: once with all-zero noise and once with the policy's own standard-normal noise at the start, then the agent's
deterministic noise at every checkpoint, paired against zero noise on the same episodes. It also asks the noise
critic whether it ranks the agent's first chunk against zero noise's the way the outcomes do (``rank_agreement``).
:class:`KeepBest` holds a copy of the best agent's weights by that score (ties: the later one).
"""

from __future__ import annotations

import numpy as np
import torch

TRAIN_SEED_BASE = 500_000
"""Training sub-env ``i`` of seed ``s`` uses run seed ``TRAIN_SEED_BASE + 100 * s + i``."""
HELDIN_SEED_BASE = 600_000
"""Held-in episode ``j`` of seed ``s`` is episode 0 of run seed ``HELDIN_SEED_BASE + 1000 * s + j``."""
MAX_SEED, MAX_ENVS, MAX_HELDIN = 999, 100, 1000
RESERVED = (TRAIN_SEED_BASE, HELDIN_SEED_BASE + 1000 * (MAX_SEED + 1))
"""Run seeds that training or held-in may use: never a held-out seed."""


def heldin_seeds(seed: int, episodes: int) -> list[int]:
    return [HELDIN_SEED_BASE + 1000 * seed + j for j in range(episodes)]


def streams(seed: int, num_envs: int, heldin_episodes: int, eval_seed: int, eval_episodes: int) -> dict:
    """The three streams of one run, as ``result.json`` names them."""
    return {
        "training": {"run_seeds": [TRAIN_SEED_BASE + 100 * seed + i for i in range(num_envs)],
                     "rule": "TRAIN_SEED_BASE + 100 x seed + sub-env; a sub-env's episodes follow its run seed"},
        "held_in": {"run_seeds": heldin_seeds(seed, heldin_episodes), "episode": 0,
                    "rule": "HELDIN_SEED_BASE + 1000 x seed + j, episode 0 of each"},
        "held_out": {"run_seed": eval_seed, "episodes": eval_episodes,
                     "rule": "episode_seed(run_seed, i), i < episodes; chosen before training, scored once after it"},
    }  # fmt: skip


class HeldIn:
    """Plays the held-in episodes of ``seeds`` on ``venv`` (a SAME_STEP noise-steering vector env of its own)."""

    def __init__(self, venv, seeds: list[int], features, gamma: float):
        self.venv, self.seeds, self.features, self.gamma = venv, list(seeds), features, gamma
        self.n, (self.h, self.a) = venv.num_envs, venv.chunk_shape
        self.zero: dict | None = None
        self.own: dict | None = None

    def play(self, act) -> dict:
        """``act(features [B, D]) -> noise [B, H*A]`` on every held-in episode: outcomes, first steps, chunk rows."""
        out = {"success": [], "first_obs": [], "first_noise": [], "rows": []}
        for r in range(0, len(self.seeds), self.n):
            part = self.seeds[r : r + self.n]
            padded = part + [part[-1]] * (self.n - len(part))  # a short last round: the extra rows are not counted
            obs, _ = self.venv.reset(seed=padded)
            live = np.ones(self.n, bool)
            success = [False] * self.n
            rows: list[list] = [[] for _ in range(self.n)]
            first = True
            while live.any():
                f = self.features(obs)
                w = np.asarray(act(f), np.float32)
                if first:
                    out["first_obs"].append(f[: len(part)])
                    out["first_noise"].append(w[: len(part)])
                    first = False
                obs, _, term, trunc, info = self.venv.step(w.reshape(self.n, self.h, self.a))
                for i in np.flatnonzero(live):
                    done = bool(term[i] or trunc[i])
                    rows[i].append((f[i], w[i]))
                    if done:
                        fin = info["final_info"]
                        success[i] = bool(fin["_is_success"][i] and fin["is_success"][i])
                        live[i] = False
            out["success"] += success[: len(part)]
            out["rows"] += rows[: len(part)]
        out["first_obs"] = np.concatenate(out["first_obs"])
        out["first_noise"] = np.concatenate(out["first_noise"])
        return out

    def baselines(self, seed: int) -> None:
        """Zero noise and the policy's own standard-normal noise (drawn from ``seed``), once per run."""
        dim = self.h * self.a
        self.zero = self.play(lambda f: np.zeros((len(f), dim), np.float32))
        rng = np.random.default_rng([seed, 0x4E1D])
        self.own = self.play(lambda f: rng.standard_normal((len(f), dim)).astype(np.float32))

    @torch.no_grad()
    def score(self, agent) -> dict:
        """The agent's deterministic noise on the held-in episodes, paired against zero noise."""
        assert self.zero is not None and self.own is not None, "call baselines() first"
        run = self.play(lambda f: agent.act(f, deterministic=True))
        s, z = run["success"], self.zero["success"]
        n = len(s)
        # the noise critic's ranking of the agent's first chunk against zero noise's, at the same start state
        obs = torch.as_tensor(run["first_obs"])
        dq = (
            agent.noise_value(obs, torch.as_tensor(run["first_noise"]))
            - agent.noise_value(obs, torch.as_tensor(self.zero["first_noise"]))
        ).numpy()
        differ = [i for i in range(n) if s[i] != z[i]]
        agree = [bool((dq[i] > 0) == s[i]) for i in differ]
        # the noise critic on every chunk the agent played against its discounted return in the same episode
        q, g = [], []
        for ok, rows in zip(s, run["rows"]):
            f = torch.as_tensor(np.stack([r[0] for r in rows]))
            w = torch.as_tensor(np.stack([r[1] for r in rows]))
            q += agent.noise_value(f, w).tolist()
            g += [float(ok) * self.gamma ** (len(rows) - 1 - k) for k in range(len(rows))]
        q, g = np.asarray(q), np.asarray(g)
        corr = float(np.corrcoef(q, g)[0, 1]) if len(q) > 2 and q.std() > 0 and g.std() > 0 else None
        return {
            "episodes": n, "success": sum(s), "zero_noise": sum(z), "own_noise": sum(self.own["success"]),
            "fixed": sum(a and not b for a, b in zip(s, z)), "broken": sum(b and not a for a, b in zip(s, z)),
            "rank_agreement": (sum(agree) / len(agree)) if agree else None, "ranked_pairs": len(agree),
            "q_vs_return": {"q_mean": float(q.mean()), "return_mean": float(g.mean()), "corr": corr},
        }  # fmt: skip


def weights(module: torch.nn.Module) -> dict:
    """A copy of ``module``'s state dict, detached from training."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class KeepBest:
    """A copy of the best agent's weights by held-in success (ties: the later checkpoint). :attr:`state` is replaced,
    never changed in place, so a reference to it stays that checkpoint's."""

    def __init__(self):
        self.state: dict | None = None
        self.point: dict | None = None

    def offer(self, agent, point: dict) -> bool:
        if self.point is not None and point["success"] < self.point["success"]:
            return False
        self.state = weights(agent)
        self.point = point
        return True

    def restore(self, agent) -> None:
        if self.state is not None:
            agent.load_state_dict(self.state)


def line(p: dict, kept: dict | None = None) -> str:
    """One live line of the held-in curve; ``kept``: the checkpoint kept so far, named when ``p`` is not it."""
    n = p["episodes"]
    rank = "n/a" if p["rank_agreement"] is None else f"{p['rank_agreement']:.0%} of {p['ranked_pairs']}"
    ent = ("" if p.get("entropy") is None else f", entropy {p['entropy']:.1f}") + f", alpha {p['alpha']:.4f}"
    if p.get("kept"):
        tail = " <- kept"
    elif kept is not None:
        more = kept["success"] - p["success"]
        tail = f" (kept: minute {kept['minutes']:.1f}, {kept['success']}/{n}"
        tail += (f": {more} more successes than this one" if more > 0 else "") + ")"
    else:
        tail = ""
    return (
        f"held-in {p['minutes']:5.1f} min {p['transitions']:>8,} transitions: agent {p['success']}/{n} "
        f"({p['success'] / n:.0%}) vs zero noise {p['zero_noise']}/{n}, own noise {p['own_noise']}/{n} "
        f"[{p['fixed']} fixed / {p['broken']} broken; critic ranks first chunks {rank}]{ent}{tail}"
    )


def kept_line(p: dict) -> str:
    """The run's last line: which agent was kept and what it scored."""
    n = p["episodes"]
    return (
        f"kept agent from minute {p['minutes']:.1f}: {p['success'] / n:.1%} held-in vs {p['zero_noise'] / n:.1%} zero "
        f"noise ({n} held-in episodes; {p['transitions']:,} transitions)"
    )
