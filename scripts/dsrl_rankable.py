r"""Can chunks at one PushBlock state be ranked at all, given the right answers? A supervised upper bound for the critic.

    python scripts/dsrl_probe.py --states 800 --seed 7778000 --view state+velocity --out tr.json --dump tr.npz
    python scripts/dsrl_probe.py --states 120 --view state+velocity --out te.json --dump te.npz
    python scripts/dsrl_rankable.py tr.npz te.npz
    python scripts/dsrl_rankable.py tr.npz te.npz --frame block             # translation- and rotation-free inputs
    python scripts/dsrl_rankable.py tr.npz te.npz --train-states 94 --epochs 240 --only pairwise   # a learning curve

The probe's dumps hold, per state, K chunks tried there and whether each, followed by zero noise, succeeded: exactly
the within-state comparisons a DSRL critic would need, labelled without bootstrapping. This fits the critic's own
architecture (LayerNorm MLP on features + executed chunk) to them, by a per-state pairwise loss and by plain success
classification, and scores pairwise agreement on the other file's states (0.5 is chance; interval: resampling
states). Well above chance: the critic's inputs can rank chunks and DSRL's data or targets are what fail; at chance:
what decides a push is not in the critic's inputs at this scale. ``picked``: the success rate at the test states of
the chunk each fitted critic ranks first, against zero noise's there (the dump's all-zero noise), paired: what the
critic would be worth if it chose one chunk per state from these K.

``--frame block`` replaces the inputs by PushBlock's push geometry: everything in the frame whose x axis runs from
the named block to the named target (distance to go; pusher and other blocks relative to the block; pusher and block
velocities; the chunk's actions rotated the same way), so that a push learnt in one place and heading is the same
input in any other. ``--train-states N`` fits on a random N of the training states (a learning curve).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from rollcap.envs.push_block import STATE_DIM
from rollcap.envs.scene import BLOCKS, TARGETS
from rollcap.rollout.learn.noise_agent import mlp
from rollcap.rollout.stats import pairwise_agreement


def load(path):
    z = np.load(path)
    return {k: z[k] for k in z.files}


def agreement(score: np.ndarray, success: np.ndarray) -> dict:
    """Pairwise agreement over pairs whose outcomes differ, with a 95% interval from resampling states."""
    got = pairwise_agreement(score, success)
    if got is None:
        return {"states": 0, "pairs": 0, "agreement": None, "ci95": None}
    return {**got, "agreement": round(got["agreement"], 4), "ci95": [round(c, 4) for c in got["ci95"]]}


def block_frame(features: np.ndarray, chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PushBlock's features (``state``, optionally ``block_velocity``, then the block/target one-hot) and chunks
    ``[..., H * 2]`` in the frame whose x axis runs from the named block to the named target."""
    nb, nt = len(BLOCKS), len(TARGETS)
    width = features.shape[-1]
    velocity = width == STATE_DIM + 3 * nb + nb + nt
    if not velocity and width != STATE_DIM + nb + nt:
        raise ValueError(f"--frame block: features of width {width} are not PushBlock's (state [+ velocity] + task)")
    f = features.reshape(-1, width).astype(np.float64)
    rows = np.arange(len(f))
    code = f[:, width - nb - nt :]
    b, t = code[:, :nb].argmax(1), code[:, nb:].argmax(1)
    blocks = f[:, 4 : 4 + 4 * nb].reshape(-1, nb, 4)[..., :2]  # relative to the pusher
    block, target = blocks[rows, b], f[:, 4 + 4 * nb : STATE_DIM].reshape(-1, nt, 4)[rows, t, :2]
    to_go = target - block
    dist = np.linalg.norm(to_go, axis=1, keepdims=True)
    u = to_go / np.maximum(dist, 1e-6)

    def rot(v):  # world x, y -> along the push, across it (``v`` [rows, ..., 2])
        d = u.reshape(len(u), *[1] * (v.ndim - 2), 2)
        return np.stack([(v * d).sum(-1), v[..., 1] * d[..., 0] - v[..., 0] * d[..., 1]], -1)

    parts = [dist, rot(-block), np.linalg.norm(block, axis=1, keepdims=True), rot(f[:, 2:4])]
    if velocity:
        parts.append(rot(f[:, STATE_DIM : STATE_DIM + 3 * nb].reshape(-1, nb, 3)[rows, b, :2]))
    for j in range(nb):
        parts.append(rot(blocks[:, j] - block) * (b != j)[:, None])
    turned = rot(chunk.reshape(len(f), -1, 2).astype(np.float64))
    lead = features.shape[:-1]
    return (np.concatenate(parts, 1).reshape(*lead, -1).astype(np.float32),
            turned.reshape(*lead, -1).astype(np.float32))  # fmt: skip


def inputs_of(d: dict, inputs: str) -> torch.Tensor:
    """``[states, K, features + chunk (or noise)]``: the critic's input for every branch (the probe's features are
    per branch already, equal across a state's K)."""
    return torch.as_tensor(np.concatenate([d["features"], d[inputs]], -1), dtype=torch.float32)


def fit(tr: dict, loss: str, inputs: str, epochs: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    x = inputs_of(tr, inputs)
    y = torch.as_tensor(tr["success"], dtype=torch.float32)
    net = mlp(x.shape[-1], 1, hidden, 3)
    opt = torch.optim.Adam(net.parameters(), lr=3e-4, weight_decay=1e-4)
    s, k = y.shape
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(s, generator=g).split(32):
            q = net(x[idx].reshape(-1, x.shape[-1])).reshape(len(idx), k)
            if loss == "pairwise":  # logistic loss on every pair with different outcomes at one state
                dq, dy = q[:, :, None] - q[:, None, :], y[idx][:, :, None] - y[idx][:, None, :]
                m = dy > 0
                out = torch.nn.functional.softplus(-dq[m]).mean() if m.any() else q.sum() * 0
            else:
                out = torch.nn.functional.binary_cross_entropy_with_logits(q, y[idx])
            opt.zero_grad()
            out.backward()
            opt.step()
    return net


def picked(score: np.ndarray, d: dict) -> dict | None:
    """Success of the chunk ``score`` ranks first at each state, against zero noise's there (fixed / broken)."""
    zero = ~d["noise"].any(-1)
    if not zero.any(1).all():
        return None
    rows = np.arange(len(score))
    ok, base = d["success"][rows, score.argmax(1)], d["success"][rows, zero.argmax(1)]
    return {"picked": round(float(ok.mean()), 4), "zero_noise": round(float(base.mean()), 4),
            "fixed": int((ok & ~base).sum()), "broken": int((~ok & base).sum())}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--frame", choices=("world", "block"), default="world", help="the inputs as dumped, or PushBlock's push frame"
    )
    ap.add_argument("--train-states", type=int, help="fit on this many of the training states (random, by --seed)")
    ap.add_argument("--only", choices=("pairwise", "bce"), help="fit this loss only (default: both)")
    args = ap.parse_args(argv)
    tr, te = load(args.train), load(args.test)
    n = len(tr["success"])
    if args.train_states is not None:
        if not 1 <= args.train_states <= n:
            ap.error(f"--train-states: expected 1..{n} ({args.train} holds {n} states), got {args.train_states}")
        keep = np.random.default_rng(args.seed).permutation(n)[: args.train_states]
        tr = {k: v[keep] for k, v in tr.items()}
    if args.frame == "block":
        for d, path in ((tr, args.train), (te, args.test)):
            try:
                d["features"], d["chunk"] = block_frame(d["features"], d["chunk"])
            except ValueError as err:
                ap.error(f"{path}: {err}")
    torch.set_num_threads(1)
    out = {"train_states": int(tr["success"].shape[0]), "test_states": int(te["success"].shape[0]),
           "train_on_chunk": float(np.mean([len(set(r)) > 1 for r in tr["success"]])), "frame": args.frame}  # fmt: skip
    for inputs in ("chunk", "noise"):
        for loss in (args.only,) if args.only else ("pairwise", "bce"):
            net = fit(tr, loss, inputs, args.epochs, args.hidden, args.seed)
            with torch.no_grad():
                for name, d in (("train", tr), ("test", te)):
                    x = inputs_of(d, inputs)
                    q = net(x.reshape(-1, x.shape[-1])).reshape(d["success"].shape).numpy()
                    out[f"{inputs}/{loss}/{name}"] = agreement(q, d["success"].astype(bool))
                out[f"{inputs}/{loss}/picked"] = picked(q, te)
            print(inputs, loss, out[f"{inputs}/{loss}/train"], out[f"{inputs}/{loss}/test"], out[f"{inputs}/{loss}/picked"], file=sys.stderr)  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
