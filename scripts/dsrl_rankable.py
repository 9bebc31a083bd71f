r"""Can chunks at one PushBlock state be ranked at all, given the right answers? A supervised upper bound for the critic.

    python scripts/dsrl_probe.py --states 800 --seed 7778000 --view state+velocity --out tr.json --dump tr.npz
    python scripts/dsrl_probe.py --states 120 --view state+velocity --out te.json --dump te.npz
    python scripts/dsrl_rankable.py tr.npz te.npz

The probe's dumps hold, per state, K chunks tried there and whether each, followed by zero noise, succeeded: exactly
the within-state comparisons a DSRL critic would need, labelled without bootstrapping. This fits the critic's own
architecture (LayerNorm MLP on features + executed chunk) to them, by a per-state pairwise loss and by plain success
classification, and scores pairwise agreement on the other file's states (0.5 is chance; interval: resampling
states). Well above chance: the critic's inputs can rank chunks and DSRL's data or targets are what fail; at chance:
what decides a push is not in the critic's inputs at this scale.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tr, te = load(args.train), load(args.test)
    torch.set_num_threads(1)
    out = {"train_states": int(tr["success"].shape[0]), "test_states": int(te["success"].shape[0]),
           "train_on_chunk": float(np.mean([len(set(r)) > 1 for r in tr["success"]]))}  # fmt: skip
    for inputs in ("chunk", "noise"):
        for loss in ("pairwise", "bce"):
            net = fit(tr, loss, inputs, args.epochs, args.hidden, args.seed)
            with torch.no_grad():
                for name, d in (("train", tr), ("test", te)):
                    x = inputs_of(d, inputs)
                    q = net(x.reshape(-1, x.shape[-1])).reshape(d["success"].shape).numpy()
                    out[f"{inputs}/{loss}/{name}"] = agreement(q, d["success"].astype(bool))
            print(inputs, loss, out[f"{inputs}/{loss}/train"], out[f"{inputs}/{loss}/test"], file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
