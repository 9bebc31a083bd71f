"""``rollcap bench --only peer``: rollcap's loop beside the loop users write today, same env and policy.

Why: a speed figure means little without the alternative. The peer loop is
driven the way LeRobot's evaluation rollout and openpi-client's runtime drive
a chunking policy:

- the policy is the plain ``nn.Module`` (eager), called on the caller's thread
  with torch's default intra-op threads;
- an action queue is refilled with the first ``execute_steps`` actions of a
  new chunk when it runs empty (LeRobot's ``n_action_steps`` queue, openpi's
  ``ActionChunkBroker``), and one action is popped per env step;
- each finished episode is written synchronously (``np.savez_compressed`` of
  its observations, actions and rewards) before the next one starts.

There is no critic in the peer loop. rollcap's loop is ``rollcap run``'s: the
captured policy and the critic on two lanes, recorded in both formats by the
background writer; it is also run without the critic. The peer runs with
torch's default intra-op threads (what a user gets) and with one thread (as
each of rollcap's lanes). The peer uses the same derived noise per chunk, so both
loops run the very same episodes (their step counts are compared).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from rollcap.rollout.bench.timing import ratio_text, spread
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.seeding import chunk_noise, episode_seed


def peer_episode(env, policy, seed: int, out: Path, chunk_s: list[float]) -> int:
    """One episode the LeRobot / openpi way; returns its env steps and appends each chunk's latency to ``chunk_s``."""
    obs, _ = env.reset(seed=seed)
    queue: deque = deque()
    frames: dict[str, list] = {}
    actions, rewards, k, steps = [], [], 0, 0
    while True:
        if not queue:  # refill when empty: one eager forward per chunk
            t0 = time.perf_counter()
            chunk = policy.act_eager(obs, chunk_noise(seed, k, policy.noise_shape[1:]))
            chunk_s.append(time.perf_counter() - t0)
            queue.extend(chunk[: policy.execute_steps])
            k += 1
        for key, v in obs.items():
            if isinstance(v, np.ndarray):
                frames.setdefault(key, []).append(v)
        action = queue.popleft()
        obs, reward, terminated, truncated, _ = env.step(action)
        actions.append(action)
        rewards.append(reward)
        steps += 1
        if terminated or truncated:
            break
    np.savez_compressed(
        out,
        actions=np.stack(actions),
        rewards=np.asarray(rewards),
        **{f"obs_{k}": np.stack(v) for k, v in frames.items()},
    )
    return steps


def bench_peer(parts: Parts, n: int) -> dict:
    """Episodes/s and per-chunk latency of the peer loop and of rollcap's, in interleaved rounds.

    Returns:
        JSON-able: per loop ``episodes_per_s`` (median, min, max over rounds),
        ``chunk_ms`` (median over every chunk), ``steps``; and
        ``rollcap_over_peer`` (episodes/s ratio, per round: median, min, max).
    """
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost
    from rollcap.rollout.recording import EpisodeRecorder
    from rollcap.rollout.subscribers import InBackground, Metrics

    quick = n < 100
    episodes, rounds, seed = (1, 3, 7) if quick else (10, 3, 7)  # three rounds: a ratio with a range
    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = make_runners(parts)
    env_meta = {"env_name": parts.env_id, "type": 2, "env_kwargs": dict(parts.env_kwargs or {})}
    default_threads = torch.get_num_threads()
    # torch's default threads (2 here) stall for 100s of ms per chunk when the machine is busy: full runs only
    names = (
        ("peer_1_thread", "rollcap", "rollcap_no_critic")
        if quick
        else ("peer_default_threads", "peer_1_thread", "rollcap", "rollcap_no_critic")
    )
    rate: dict[str, list[float]] = {k: [] for k in names}
    chunk_s: dict[str, list[float]] = {k: [] for k in names}
    steps: dict[str, int] = {k: 0 for k in names}
    with tempfile.TemporaryDirectory(prefix="rollcap-peer-") as tmp:
        for r in range(rounds):
            for name in names:
                out = Path(tmp) / f"{name}{r}"
                t0 = time.perf_counter()
                if name.startswith("peer"):
                    out.mkdir()
                    torch.set_num_threads(1 if name == "peer_1_thread" else default_threads)
                    try:
                        for i in range(episodes):
                            steps[name] += peer_episode(
                                env, policy, episode_seed(seed, i), out / f"episode_{i}.npz", chunk_s[name]
                            )
                    finally:
                        torch.set_num_threads(default_threads)
                else:
                    metrics = Metrics()
                    rec = EpisodeRecorder(out, formats=("npz", "h5"), env_meta=env_meta)
                    host = RolloutHost(
                        env,
                        policy,
                        critic if name == "rollcap" else None,
                        HostConfig(seed=seed),
                        [metrics, InBackground(rec)],
                    )
                    ends = host.run(episodes)  # drains the writer before it returns
                    chunk_s[name] += metrics.boundary_s
                    steps[name] += sum(e.record.num_steps for e in ends if e.record is not None)
                rate[name].append(episodes / (time.perf_counter() - t0))
    policy.close()
    critic.close()
    env.close()
    return {
        "episodes_per_round": episodes,
        "rounds": rounds,
        "default_threads": default_threads,
        "loops": {
            name: {
                "episodes_per_s": spread(rate[name]),
                "chunk_ms": statistics.median(chunk_s[name]) * 1e3,
                "chunks": len(chunk_s[name]),
                "steps": steps[name],
            }
            for name in names
        },
        "rollcap_over_peer_1_thread": spread([a / b for a, b in zip(rate["rollcap"], rate["peer_1_thread"])]),
        **(
            {
                "rollcap_over_peer_default_threads": spread(
                    [a / b for a, b in zip(rate["rollcap"], rate["peer_default_threads"])]
                )
            }
            if "peer_default_threads" in rate
            else {}
        ),
        "same_episodes": len(set(steps.values())) == 1,
    }


def format_peer(p: dict, row) -> None:
    """Rows for the human table (``row(name, value)``)."""
    labels = {
        "peer_default_threads": f"peer loop, torch's default {p['default_threads']} threads",
        "peer_1_thread": "peer loop, 1 thread (as rollcap's lanes)",
        "rollcap": "rollcap run (captured + critic lane)",
        "rollcap_no_critic": "rollcap run, no critic",
    }
    for name, label in labels.items():
        if name not in p["loops"]:
            continue
        lp = p["loops"][name]
        e = lp["episodes_per_s"]
        row(
            label,
            f"{e['median']:.2f} episodes/s ({e['min']:.2f}-{e['max']:.2f}), chunk {lp['chunk_ms']:.2f} ms (median of {lp['chunks']})",
        )
    for key in ("rollcap_over_peer_1_thread", "rollcap_over_peer_default_threads"):
        if key not in p:
            continue
        row(key.replace("_", " "), ratio_text(p[key], p.get("load")))
    row("same episodes in every loop", str(p["same_episodes"]))
