r"""Flow RL through the gymnasium door, with a learner of your own: GRPO on the FlowVLA in about 60 lines.

    python examples/flow_rl_gym.py --iterations 20 --groups 4 --group-size 4

The vector env runs the shipped PushBlock policy with the sde sampler (``Parts(sampler="sde")``): an action is
each sub-env's initial flow noise (standard normal: the policy's own distribution), and each step's info holds
the chunk's ``flow_trace`` ``[K+1, H, A]`` and ``flow_logp`` ``[K]``, what the ratio of a policy-gradient update
needs. Groups start from one capsule (``boundary`` / ``restart``: the same exact state, byte for byte). After
the update, ``load_weights`` puts the learner's weights into the captured graph in place (nothing rebuilt or
recaptured: the capture count printed stays where it was) and ends the running episodes, so ``reset`` follows.
``rollcap.rollout.learn.flow_rl`` (``examples/flow_rl.py``) is the full loop: keep-best, held-out, resume.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rollcap.kernels.graph import capture_count
from rollcap.policies import load_policy
from rollcap.policies.flow_sde import step_logp
from rollcap.rollout.gym.vector import make_noise_steering_vector_env
from rollcap.rollout.spec import Parts


def main(iterations: int = 3, groups: int = 2, group_size: int = 4, lr: float = 3e-5, seed: int = 0) -> list[float]:
    n, level = groups * group_size, 0.5
    model = load_policy()  # the learner's copy (the env's graph holds its own)
    for p in model.parameters():
        p.requires_grad_(False)
    params = list(model.expert.parameters())  # the action expert is trained; the prefix encoder stays as it is
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=lr)
    venv = make_noise_steering_vector_env(
        n, parts=Parts(sampler="sde", noise_level=level, critic="none"), config={"execute_steps": 8},
        autoreset_mode=AutoresetMode.SAME_STEP, max_tokens=model.cfg.max_tokens,
    )  # fmt: skip
    captures, rng, curve = capture_count(), np.random.default_rng(seed), []
    try:
        for it in range(iterations):
            obs, _ = venv.reset(seed=[10_000 * seed + it * n + i for i in range(n)])
            for m in range(groups):  # each group: one capsule, its members differ only in their noise
                at = venv.boundary(m * group_size)
                for j in range(m * group_size + 1, (m + 1) * group_size):
                    one, _ = venv.restart(j, at)
                    for k in obs:
                        obs[k][j] = one[k]
            live, won, rows = np.ones(n, bool), np.zeros(n, bool), [[] for _ in range(n)]
            while live.any():
                noise = rng.standard_normal((n, *venv.chunk_shape)).astype(np.float32)
                nxt, _, term, trunc, info = venv.step(noise)
                for i in np.flatnonzero(live):
                    src = info["final_info"] if term[i] or trunc[i] else info  # SAME_STEP: the ended one's info
                    rows[i].append((obs["image_front"][i], obs["state"][i], obs["instruction_tokens"][i],
                                    src["flow_trace"][i], src["flow_logp"][i]))  # fmt: skip
                    if term[i] or trunc[i]:
                        live[i], won[i] = False, bool(src["is_success"][i])
                obs = nxt
            r = won.reshape(groups, group_size).astype(np.float64)  # GRPO: the group-relative outcome
            adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)).reshape(-1)
            batch = [(*row, adv[i]) for i in range(n) if adv[i] != 0 for row in rows[i]]
            if batch:
                img, state, tok, trace, old, a = (torch.from_numpy(np.stack(c)) for c in zip(*batch))
                new = step_logp(model, [img], state, tok, trace, level)  # [chunks, K]: every denoising step
                ratio = (new - old).exp()
                loss = -torch.minimum(ratio * a[:, None], ratio.clamp(0.8, 1.2) * a[:, None]).mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            digest = venv.load_weights(copy.deepcopy(model.state_dict()))  # in place: the graph is not rebuilt
            curve.append(float(won.mean()))
            print(f"iteration {it}: success {won.mean():.2f}, {len(batch)} chunks trained, weights {digest[:19]}, "
                  f"graphs captured since the env was made: {capture_count() - captures}", flush=True)  # fmt: skip
    finally:
        venv.close()
    return curve


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    main(a.iterations, a.groups, a.group_size, a.lr, a.seed)
