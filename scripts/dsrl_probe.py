r"""Can a DSRL critic rank chunks at one state? Branch K chunks from the same state and ask the outcomes and the critic.

    python scripts/dsrl_probe.py --task pushblock --states 48 --run runs/dsrl/push-na-guard-0 --out probe.json

For each of ``--states`` start states (episode 0 of run seeds ``--seed`` + j: a development stream, neither training,
held-in nor held-out), ``K`` sub-envs of one vector env reset to the same state and play ``--prefix`` chunks of zero
noise (the same chunks, so the same state), then branch: sub-env 0 plays zero noise, the others a standard-normal noise
each, for one chunk; every sub-env then plays zero noise to the end. Measured per branch state: whether the
outcomes differ (something to rank), the target block's and the pusher's speed there (the agent's state has the block's
pose, not its velocity), and with ``--run`` (a run directory of examples/dsrl.py) the trained critics' values of the
K chunks: QA(s, a) on the executed chunk and QW(s, w) on the noise, scored by pairwise agreement with the outcomes on
pairs whose outcomes differ (0.5 is chance).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from safetensors.torch import load_file

from rollcap.rollout.gym.vector import make_noise_steering_vector_env
from rollcap.rollout.learn.dsrl_eval import TASKS, VIEWS, _task_code, features, viewed
from rollcap.rollout.learn.noise_agent import AgentConfig, NoiseAgent
from rollcap.rollout.stats import pairwise_agreement


def load_agent(run: Path, obs_dim: int, noise_dim: int, action_dim: int, name: str = "agent") -> NoiseAgent:
    cfg = json.loads((run / "result.json").read_text())["config"]["agent"]
    agent = NoiseAgent(obs_dim, noise_dim, action_dim, AgentConfig(**cfg))
    agent.load_state_dict(load_file(str(run / f"{name}.safetensors")))
    return agent


def speeds(venv, i: int) -> tuple[float, float]:
    """The target block's and the pusher's planar speed (m/s) in sub-env ``i`` (PushBlock only)."""
    env = venv.core.hosts[i].env.unwrapped
    b = env._task[0]
    v = env.data.qvel
    return float(np.hypot(v[2 + 3 * b], v[3 + 3 * b])), float(np.hypot(v[0], v[1]))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="pushblock", choices=sorted(TASKS))
    ap.add_argument("--states", type=int, default=48)
    ap.add_argument("--branches", type=int, default=8, help="K: chunks tried at each state (the first is zero noise)")
    ap.add_argument("--prefix", type=int, default=2, help="zero-noise chunks before the branch")
    ap.add_argument("--seed", type=int, default=7_777_000, help="first run seed of the development stream")
    ap.add_argument(
        "--run", type=Path, help="a run directory of examples/dsrl.py: rank with its critics (and its view)"
    )
    ap.add_argument(
        "--agent", default="agent", choices=("agent", "agent-snapshot", "agent-last"),
        help="which of the run's agents: the kept one (default), the snapshot's or the last one",
    )  # fmt: skip
    ap.add_argument("--view", choices=VIEWS, help="what the agent sees (default: the run's, else state)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dump", type=Path, help="also write each branch's features, noise, chunk and outcome (npz)")
    return ap


def _branch_outcomes(venv, w: np.ndarray, zero: np.ndarray, e: int) -> tuple[np.ndarray, list[bool]]:
    """Step the K sub-envs (at one state) with noises ``w``, then zero noise until each ends: the chunks the
    branches executed (their first ``e`` actions) and whether each succeeded."""
    k, h, a = zero.shape
    obs, _, term, trunc, info = venv.step(w.reshape(k, h, a))
    done = term | trunc
    src = [info["final_info"] if done[i] else info for i in range(k)]
    chunks = np.stack([np.asarray(src[i]["policy_chunk"][i], np.float32)[:e].reshape(-1) for i in range(k)])
    success = [bool(done[i] and src[i]["_is_success"][i] and src[i]["is_success"][i]) for i in range(k)]
    live = ~done
    while live.any():
        obs, _, term, trunc, info = venv.step(zero)
        for i in np.flatnonzero(live & (term | trunc)):
            success[i] = bool(info["final_info"]["_is_success"][i] and info["final_info"]["is_success"][i])
        live &= ~(term | trunc)
    return chunks, success


def _summary(rows: list[dict], k: int, view: str, args) -> dict:
    """The probe's summary over its states' rows: how often the chunk decides the outcome, and the critics' agreement."""

    def agreement(key):
        if any(key not in r for r in rows):
            return None
        got = pairwise_agreement([r[key] for r in rows], [r["success"] for r in rows])
        if got is None:
            return {"pairs": 0, "states": 0, "agreement": None, "ci95_over_states": None}
        return {"pairs": got["pairs"], "states": got["states"], "agreement": got["agreement"], "ci95_over_states": got["ci95"]}  # fmt: skip

    differ = [r for r in rows if len(set(r["success"])) > 1]
    spd = np.array([r["block_speed"] for r in rows if r["block_speed"] is not None])
    summary = {
        "states": len(rows), "branches": k, "view": view, "prefix": args.prefix, "dev_run_seeds": [args.seed, args.seed + args.states - 1],
        "states_whose_outcome_turns_on_the_chunk": len(differ),
        "mean_success": float(np.mean([np.mean(r["success"]) for r in rows])) if rows else None,
        "zero_noise_success": float(np.mean([r["success"][0] for r in rows])) if rows else None,
        "best_of_k_success": float(np.mean([max(r["success"]) for r in rows])) if rows else None,
        "block_speed": {"mean": float(spd.mean()), "median": float(np.median(spd)), "over_0.02": float((spd > 0.02).mean())} if len(spd) else None,
        "block_speed_where_outcomes_differ": float(np.mean([r["block_speed"] for r in differ])) if differ and spd.size else None,
        "qa_pairwise": agreement("qa"), "qw_pairwise": agreement("qw"),
    }  # fmt: skip
    return summary


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.states < 1 or args.branches < 2 or args.prefix < 0:
        ap.error("--states >= 1, --branches >= 2, --prefix >= 0")
    if args.run is not None and not (args.run / f"{args.agent}.safetensors").is_file():
        ap.error(f"--agent: {args.run / (args.agent + '.safetensors')} does not exist (no such agent in that run)")
    view = args.view
    if view is None:
        view = (
            json.loads((args.run / "result.json").read_text())["config"].get("view", "state") if args.run else "state"
        )
    task = viewed(TASKS[args.task], view)
    code = _task_code(task)
    k, e = args.branches, task.execute_steps
    venv = make_noise_steering_vector_env(k, config={"execute_steps": e}, parts=task.parts(1), autoreset_mode=AutoresetMode.SAME_STEP)  # fmt: skip
    h, a = venv.chunk_shape
    agent = None
    rng = np.random.default_rng(args.seed)
    rows, dump = [], {"features": [], "noise": [], "chunk": [], "success": [], "run_seed": []}
    try:
        for j in range(args.states):
            obs, _ = venv.reset(seed=[args.seed + j] * k)
            zero = np.zeros((k, h, a), np.float32)
            alive = True
            for _ in range(args.prefix):
                obs, _, term, trunc, _ = venv.step(zero)
                if (term | trunc).any():
                    alive = False
                    break
            if not alive:
                continue  # ended before the branch: nothing to rank
            f = features(obs, code, task.extra)
            assert (f == f[0]).all(), "the sub-envs should be at one state"
            block, pusher = speeds(venv, 0) if args.task == "pushblock" else (None, None)
            w = np.concatenate(
                [np.zeros((1, h * a), np.float32), rng.standard_normal((k - 1, h * a)).astype(np.float32)]
            )
            chunks, success = _branch_outcomes(venv, w, zero, e)
            row = {"run_seed": args.seed + j, "success": success, "block_speed": block, "pusher_speed": pusher}
            if args.run is not None:
                if agent is None:
                    agent = load_agent(args.run, f.shape[1], h * a, e * a, args.agent)
                with torch.no_grad():
                    o = torch.as_tensor(f)
                    row["qw"] = agent.noise_value(o, torch.as_tensor(w)).tolist()
                    if agent.cfg.algorithm == "na":
                        row["qa"] = agent.action_value(o, torch.as_tensor(chunks)).tolist()
            rows.append(row)
            for key, v in (("features", f), ("noise", w), ("chunk", chunks), ("success", success), ("run_seed", [args.seed + j] * k)):  # fmt: skip
                dump[key].append(np.asarray(v))
            speed = "" if block is None else f", block {block:.3f} m/s, pusher {pusher:.3f} m/s"
            print(f"state {j}: {sum(success)}/{k} succeed{speed}", file=sys.stderr)
    finally:
        venv.close()

    summary = _summary(rows, k, view, args)
    args.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if args.dump is not None and rows:
        np.savez(args.dump, **{key: np.stack(v) for key, v in dump.items()})  # [states, K, ...]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
