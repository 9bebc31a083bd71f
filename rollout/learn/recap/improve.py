"""RECAP stage 4, improve: fine-tune the policy with the advantage indicator, then choose the guidance weight.

The fine-tune starts from the policy's weights and trains the flow-matching
loss of :meth:`~rollcap.policies.FlowVLA.loss` on the rollouts (their
advantage indicator from stage 3; steps with a fully known action window
only) and the demonstrations (their shipped labels), uniformly mixed. The
indicator is dropped with the policy's ``adv_dropout`` (0.3 shipped, as in
the paper), which is what makes classifier-free guidance possible at
deployment: ``v = v_dropped + beta * (v_positive - v_dropped)``.

``beta`` is a config field of the checkpoint (``cfg_beta``), so the deployed
weight travels in the checkpoint's JSON and its fingerprint. It is chosen on
the validation seed stream (:data:`~rollcap.rollout.learn.recap.evaluate.VALIDATION`),
never on the held-out seeds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rollcap.rollout.learn.recap.collect import Steps
from rollcap.rollout.learn.recap.value import fit, gather, image_inputs


def with_beta(model, beta: float):
    """A copy of the FlowVLA ``model`` whose guidance weight is ``beta`` (same weights)."""
    from rollcap.policies import FlowVLA

    out = FlowVLA(dataclasses.replace(model.cfg, cfg_beta=float(beta)))
    out.load_state_dict(model.state_dict())
    return out.eval()


def fine_tune(
    policy,
    steps: Steps,
    labels: np.ndarray,
    demos,
    *,
    n_steps: int,
    batch: int,
    lr: float,
    seed: int,
    windows: str = "boundaries",
    log=lambda line: None,
) -> list[float]:
    """Stage 4a: train ``policy`` in place on the labelled rollouts and the demonstrations; returns the losses.

    ``windows``: ``"steps"`` labels every step with the actions executed from it;
    ``"boundaries"`` only chunk boundaries, with the chunk run from there
    (:mod:`~rollcap.rollout.learn.recap.collect`).
    """
    if windows == "boundaries":
        ok, chunks = steps.boundary, steps.plan
    elif windows == "steps":
        ok, chunks = steps.label_ok, steps.chunks
    else:
        raise ValueError(f"windows: expected steps or boundaries, got {windows!r}")
    sources = [
        {
            "images": steps.images[ok],
            "state": steps.state[ok],
            "tokens": steps.tokens[ok],
            "chunks": chunks[ok],
            "adv": labels[ok],
        }
    ]
    if demos is not None:
        sources.append(
            {
                "images": demos.images,
                "state": demos.state,
                "tokens": demos.tokens,
                "chunks": demos.chunks,
                "adv": demos.adv,
            }
        )
    sizes = tuple(len(s["adv"]) for s in sources)
    log(f"improve: fine-tune the policy {n_steps} steps on {sizes[0]} rollout + {sum(sizes[1:])} demonstration steps "
        f"({float(np.mean(labels[ok] == 1)) if ok.any() else float('nan'):.0%} of rollout steps positive)")  # fmt: skip

    def loss(parts, gen):
        b = gather(sources, parts, ("images", "state", "tokens", "chunks", "adv"))
        return policy.loss(
            image_inputs(b["images"]), b["state"], b["tokens"].long(), b["adv"].long(), b["chunks"].float(), gen
        )

    return fit(policy, loss, sizes, n_steps, batch, lr, seed, log)


def choose_beta(
    policy,
    betas: tuple[float, ...],
    seeds: list[int],
    execute_steps: int,
    env=None,
    threads: int = 1,
    log=lambda line: None,
) -> tuple[float, dict]:
    """Stage 4b: the guidance weight with the most successes on the validation ``seeds`` (ties: the earlier in ``betas``)."""
    from rollcap.rollout.learn.recap.evaluate import env_list, successes

    if not seeds:
        return float(betas[0]), {}
    scores = {}
    n = len(seeds) * len(env_list(env))
    for b in betas:
        scores[float(b)] = int(successes(with_beta(policy, b), seeds, execute_steps, env, threads).sum())
        log(f"improve: beta {b:g}: {scores[float(b)]}/{n} validation successes at execute_steps {execute_steps}")
    best = max(scores, key=lambda b: (scores[b], -list(scores).index(b)))
    return best, {"execute_steps": execute_steps, "episodes": n, "successes": {f"{b:g}": s for b, s in scores.items()}}
