"""RECAP stage 2, value: targets for every collected step, the critic refit from the shipped one, its calibration.

Targets are the shipped critic's (:mod:`rollcap.rollout.learn.training`): ``-(T - t) /
max_steps`` for a step ``t`` of an episode that succeeded after ``T`` steps,
``-1`` for a natural failure (time limit, termination without success). A
*censored* episode (stopped by the critic, a key, a timeout or an error: it did
not run to its natural end) is neither: its steps are bootstrapped from the
critic at the stop, ``clip(V(o_T) - (T - t) / max_steps, -1, 0)``, the value
the critic itself would give the rest of the episode.

The refit starts from the shipped critic's weights and trains on the rollouts
and the demonstrations together. Every fifth episode of the rollouts is held
out of the refit, so :func:`critic_quality` can compare the critic before and
after on episodes neither saw. Where the input holds branch episodes
(``rollcap branch`` runs), :func:`branch_calibration` compares both critics
with the branches' Monte-Carlo values (:func:`~rollcap.rollout.offline.calibrate.calibration_stats`).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from rollcap.rollout.learn.recap.collect import Steps
from rollcap.rollout.learn.training import optimise

HOLDOUT_EVERY = 5
"""Episode rows ``r % HOLDOUT_EVERY == 0`` are held out of the critic refit (its quality is measured there)."""


def image_inputs(images) -> list[torch.Tensor]:
    """A batch's image inputs for the models: ``[images]`` (one camera, ``[B, S, S, 3]``), or ``[]`` for a state-only
    model's ``[B, 0]`` placeholder (:class:`~rollcap.rollout.learn.recap.collect.Steps`)."""
    t = torch.as_tensor(images)
    return [] if t.ndim == 2 else [t]


@torch.no_grad()
def predict(critic, images: np.ndarray, state: np.ndarray, tokens: np.ndarray, batch: int = 256) -> np.ndarray:
    """The critic's values for many observations (eager, batched, eval mode), float32 ``[N]``."""
    critic.eval()
    out = []
    for i in range(0, len(state), batch):
        sl = slice(i, i + batch)
        out.append(
            critic.value(
                image_inputs(np.ascontiguousarray(images[sl])),
                torch.from_numpy(state[sl]),
                torch.from_numpy(tokens[sl]),
            ).numpy()
        )
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


def final_values(critic, steps: Steps) -> np.ndarray:
    """The critic's value of each episode's last observation ``[E]`` (what a censored episode is bootstrapped from)."""
    return predict(critic, steps.final_images, steps.final_state, steps.final_tokens)


def value_targets(steps: Steps, v_final: np.ndarray) -> np.ndarray:
    """Per-step value targets (see the module docstring); ``v_final`` from :func:`final_values`."""
    rows = steps.episodes
    t_len = np.array([r["steps"] for r in rows])[steps.episode]
    m = np.array([r["max_steps"] for r in rows], np.float64)[steps.episode]
    togo = (t_len - steps.t) / m
    success = np.array([r["success"] for r in rows])[steps.episode]
    censored = np.array([r["censored"] for r in rows])[steps.episode]
    out = np.where(success, -togo, -1.0)
    out = np.where(censored, np.clip(v_final[steps.episode] - togo, -1.0, 0.0), out)
    return out.astype(np.float32)


def holdout_mask(steps: Steps) -> np.ndarray:
    """``[N]`` True for steps of the episodes held out of the refit."""
    return steps.episode % HOLDOUT_EVERY == 0


def fit(
    model, loss_fn, sizes: tuple[int, ...], steps: int, batch: int, lr: float, seed: int, log=lambda line: None
) -> list[float]:
    """AdamW with one-cycle cosine decay on batches drawn uniformly over the concatenation of sources of ``sizes``.

    ``loss_fn(parts, generator)`` gets one index array per source (a sample's
    row in that source). Batches come from ``numpy`` PCG64 seeded with
    ``seed`` and the loss's randomness from a torch generator seeded with it:
    the same seed gives the same weights.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    edges = np.cumsum((0, *sizes))

    def batches():
        for _ in range(steps):
            idx = np.sort(rng.integers(0, edges[-1], batch))
            yield [idx[(idx >= lo) & (idx < hi)] - lo for lo, hi in itertools.pairwise(edges)]

    losses = optimise(model, loss_fn, batches(), steps, lr, seed, log, reports=5)
    model.eval()
    return losses


def gather(sources: list[dict], parts: list[np.ndarray], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """One batch from several sources of arrays (dicts of ``key -> [N, ...]``), rows ``parts[j]`` of source ``j``."""
    return {
        k: torch.from_numpy(np.concatenate([np.asarray(s[k][p]) for s, p in zip(sources, parts, strict=True)]))
        for k in keys
    }


def refit_critic(
    critic,
    steps: Steps,
    targets: np.ndarray,
    demos,
    *,
    n_steps: int,
    batch: int,
    lr: float,
    seed: int,
    log=lambda line: None,
):
    """Stage 2: fine-tune ``critic`` (in place, from its weights) on the non-held-out rollout steps and the demonstrations."""
    train = ~holdout_mask(steps)
    roll = {
        "images": steps.images[train],
        "state": steps.state[train],
        "tokens": steps.tokens[train],
        "value": targets[train],
    }
    sources = [roll]
    if demos is not None:
        sources.append({"images": demos.images, "state": demos.state, "tokens": demos.tokens, "value": demos.value})
    sizes = tuple(len(s["value"]) for s in sources)
    log(f"value: refit the critic {n_steps} steps on {sizes[0]} rollout + {sum(sizes[1:])} demonstration steps")

    def loss(parts, gen):
        b = gather(sources, parts, ("images", "state", "tokens", "value"))
        return critic.loss(image_inputs(b["images"]), b["state"], b["tokens"].long(), b["value"].float())

    return fit(critic, loss, sizes, n_steps, batch, lr, seed, log) if n_steps else []


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    from rollcap.rollout.learn.training import auroc

    return auroc(pos, neg)


def critic_quality(values: np.ndarray, targets: np.ndarray, steps: Steps, mask: np.ndarray) -> dict:
    """How well per-step ``values`` match ``targets`` on the steps of ``mask`` (the held-out episodes).

    ``mae`` / ``bias``: against the targets; ``auroc_mid``: success vs natural
    failure from the value at each episode's middle step; ``auroc_mid_policy``
    the same question the shipped training report asks of its own policy.
    """
    err = values[mask] - targets[mask]
    mids_ok, mids_bad = [], []
    for e in np.unique(steps.episode[mask]):
        row = steps.episodes[e]
        if row["censored"] or row["steps"] == 0:
            continue
        sel = np.flatnonzero(steps.episode == e)
        v = float(values[sel[len(sel) // 2]])
        (mids_ok if row["success"] else mids_bad).append(v)
    return {
        "steps": int(mask.sum()),
        "mae": float(np.abs(err).mean()) if err.size else float("nan"),
        "bias": float(err.mean()) if err.size else float("nan"),
        "auroc_mid": _auroc(np.array(mids_ok), np.array(mids_bad)),
        "episodes": {"successes": len(mids_ok), "failures": len(mids_bad)},
    }


def branch_calibration(critics: dict, steps: Steps) -> dict | None:
    """Each critic's value at every branch boundary vs the branches' Monte-Carlo value (None without branch episodes).

    Branch episodes (``origin`` set) are grouped by (parent, episode, chunk); a
    group's Monte-Carlo value is the mean target over its branches, each
    branch's first observation is the boundary.
    """
    from rollcap.rollout.offline.calibrate import calibration_stats

    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(steps.episodes):
        if r["branch_of"] is not None and r["steps"] > 0:
            groups.setdefault(
                (r["branch_of"]["parent"], r["branch_of"]["episode"], r["branch_of"]["chunk"]), []
            ).append(i)
    groups = {k: v for k, v in groups.items() if len(v) >= 2}
    if not groups:
        return None
    first = {e: int(np.flatnonzero((steps.episode == e) & (steps.t == 0))[0]) for v in groups.values() for e in v}
    mc = np.array(
        [
            np.mean(
                [
                    (-steps.episodes[e]["steps"] / steps.episodes[e]["max_steps"])
                    if steps.episodes[e]["success"]
                    else -1.0
                    for e in v
                ]
            )
            for v in groups.values()
        ]
    )
    rows = [first[v[0]] for v in groups.values()]
    out = {"boundaries": len(groups), "branches": int(sum(len(v) for v in groups.values()))}
    for name, critic in critics.items():
        vals = predict(critic, steps.images[rows], steps.state[rows], steps.tokens[rows])
        out[name] = calibration_stats(vals, mc)
    return out
