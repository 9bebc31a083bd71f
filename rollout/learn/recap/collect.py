"""RECAP stage 1, collect: a run's recorded episodes as flat training steps, plus the shipped demonstrations.

Each episode of a run directory (local, Ray, teleop or branch runs alike; read
one at a time through :func:`~rollcap.rollout.offline.inspect.iter_any`) becomes its
``T`` steps: the observation before each step, the ``H`` actions the env
received from that step on (a person's included: that is what an intervention
teaches), who acted, and per episode how it ended. The observation after the
last step is kept too (the critic's value there closes the episode).

An episode that did not run to a natural end (``success``, ``terminated``,
``truncated``) is *censored*: the critic stopped it (or a key, a timeout, an
error). Its value targets are bootstrapped from the critic at the stop
(:mod:`rollcap.rollout.learn.recap.value`), never treated as a natural failure.

Two kinds of policy label (:class:`~rollcap.rollout.learn.recap.config.RecapConfig`
``windows``): at every step, the ``H`` actions the env received from it on
(``chunks``; steps whose window runs past the end of an episode that did not
succeed carry unknown actions and get none, ``label_ok`` False; successful
episodes pad with zeros, as the shipped training does); or at chunk
boundaries only, the chunk that ran from there (``plan``: its executed
actions as the env received them, a person's included, then the rest of the
policy's planned chunk), which never splices two plans into one label.

Imports point downward: this module knows ``inspect``, ``episode``,
``training`` (for the demonstrations) and ``policies``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rollcap.kernels.files import plain_json
from rollcap.rollout.episode import ACTOR_HUMAN
from rollcap.rollout.recording.codec import episode_digest

NATURAL_ENDS = ("success", "terminated", "truncated")
"""Stop reasons of an episode that ran to its natural end; any other is censored."""


@dataclass
class Steps:
    """Flat per-step arrays over a set of episodes (rollouts or demonstrations)."""

    images: np.ndarray  # [N, S, S, 3] uint8, observation before step t
    state: np.ndarray  # [N, D] float32
    tokens: np.ndarray  # [N, L] int64
    chunks: np.ndarray  # [N, H, A] float32, actions t .. t+H-1 (zero padded after a success)
    episode: np.ndarray  # [N] int64, row of the episode table
    t: np.ndarray  # [N] int64, step index within the episode
    human: np.ndarray  # [N] bool, a person chose action t
    label_ok: np.ndarray  # [N] bool, chunks[i] is fully known
    episodes: list[dict] = field(default_factory=list)
    """One row per episode: source, index, seed, task, steps, success, stop_reason, censored, max_steps, final row."""
    final_images: np.ndarray | None = None  # [E, S, S, 3] observation after the last step
    final_state: np.ndarray | None = None  # [E, D]
    final_tokens: np.ndarray | None = None  # [E, L]
    boundary: np.ndarray | None = None  # [N] bool, a chunk began at step t
    plan: np.ndarray | None = None  # [N, H, A] at a boundary: the chunk run from it (its executed actions as the env got them, then the rest as planned)

    def __len__(self) -> int:
        return len(self.t)


@dataclass
class Collected:
    """What :func:`collect` read: the rollout steps, the demonstrations and where they came from."""

    rollouts: Steps
    demos: object | None
    """:class:`~rollcap.rollout.learn.training.Demos` of the shipped expert (None with ``demos=0``)."""
    runs: list[dict]
    """Per input run: path, episodes, successes, digests of its seeds and of its episodes, the weights digests and config it was made with."""


def _max_steps(rec, source: str = "") -> int:
    from rollcap.rollout.offline.branch import max_steps_of

    return max_steps_of(rec, source=source)


def check_readable(rec, spec, source: str = "") -> None:
    """Refuse an episode whose observations a policy with observation spec ``spec`` cannot read (recap learns on them).

    Raises:
        ConfigError: (field ``runs``) naming the file, the env and what it recorded against what the policy reads.
    """
    from rollcap.rollout.errors import ConfigError

    want = {k: (spec.image_size, spec.image_size, 3) for k in spec.image_keys} | {"state": (spec.state_dim,)}
    have = {k: tuple(np.shape(v)) for k, v in rec.final_obs.items()}
    if any(have.get(k) != shape for k, shape in want.items()):
        where = f"{source}: " if source else ""
        recorded = ", ".join(f"{k} {v}" for k, v in have.items()) or "nothing"
        needed = ", ".join(f"{k} {v}" for k, v in want.items())
        raise ConfigError("runs", f"{where}episode {rec.index} was recorded in {rec.env_id}, whose observations the policy cannot read "
                          f"(recorded {recorded}; it reads {needed}): recap learns only from runs of an env the policy reads")  # fmt: skip


def episode_steps(rec, horizon: int, image_key: str, max_tokens: int, source: str = "") -> dict:
    """One episode's per-step arrays and its row (see :class:`Steps`); ``source``: its file, named in errors."""
    from rollcap.policies import tokenize

    t_len = rec.num_steps
    acts = rec.steps["actions"].astype(np.float32)
    pad = np.concatenate([acts, np.zeros((horizon, acts.shape[1]), np.float32)])
    chunks = np.stack([pad[t : t + horizon] for t in range(t_len)]) if t_len else np.zeros((0, horizon, acts.shape[1]), np.float32)
    label_ok = np.ones(t_len, bool) if rec.success else (np.arange(t_len) + horizon <= t_len)
    starts = rec.chunks["chunk_start"].astype(np.int64)
    boundary = np.zeros(t_len, bool)
    plan = np.zeros((t_len, horizon, acts.shape[1]), np.float32)
    for k, t0 in enumerate(starts):
        if t0 >= t_len:
            continue  # a chunk stopped before it ran
        boundary[t0] = True
        ran = int(min(starts[k + 1] if k + 1 < len(starts) else t_len, t_len) - t0)
        plan[t0, : rec.chunks["policy_chunk"].shape[1]] = rec.chunks["policy_chunk"][k][:horizon]
        plan[t0, :ran] = acts[t0 : t0 + min(ran, horizon)]
    tokens = tokenize(rec.instruction, max_tokens)
    censored = rec.stop_reason not in NATURAL_ENDS
    row = {
        "index": int(rec.index), "seed": int(rec.seed), "task": rec.env_id, "env_kwargs": plain_json(rec.env_kwargs or {}), "steps": int(t_len), "success": bool(rec.success),
        "stop_reason": rec.stop_reason, "censored": bool(censored and not rec.success), "max_steps": _max_steps(rec, source),
        "humans": int(np.count_nonzero(rec.steps["actor"] == ACTOR_HUMAN)), "branch_of": _branch_of(rec),
        "critic_at_boundaries": rec.chunks["critic_value"].astype(float).tolist(),
    }  # fmt: skip
    return {
        "images": _per_step(rec, image_key, t_len).astype(np.uint8), "state": _per_step(rec, "state", t_len).astype(np.float32),
        "tokens": np.repeat(tokens[None], t_len, 0), "chunks": chunks, "t": np.arange(t_len), "human": rec.steps["actor"] == ACTOR_HUMAN,
        "label_ok": label_ok, "boundary": boundary, "plan": plan, "row": row, "final_image": np.asarray(rec.final_obs[image_key], np.uint8),
        "final_state": np.asarray(rec.final_obs["state"], np.float32), "final_tokens": tokens,
    }  # fmt: skip


def _per_step(rec, key: str, t_len: int) -> np.ndarray:
    """``obs[key][:T]``; an episode of no steps (stopped at its first boundary) stores no per-step observations."""
    if key in rec.obs:
        return np.asarray(rec.obs[key][:t_len])
    final = np.asarray(rec.final_obs[key])
    return np.zeros((0, *final.shape), final.dtype)


def _branch_of(rec) -> dict | None:
    """``{parent, episode, chunk}`` of a branch episode (:mod:`rollcap.rollout.offline.branch`), else None."""
    o = rec.origin
    if not o:
        return None
    return {"parent": str(o.get("parent", o.get("file", ""))), "episode": int(o.get("episode", -1)), "chunk": int(o.get("chunk", -1))}


def read_runs(paths, horizon: int = 8, image_key: str = "image_front", max_tokens: int = 48, spec=None) -> tuple[Steps, list[dict]]:
    """Every episode of the run directories (or recording files) ``paths``, streamed, as :class:`Steps`.

    ``spec``: the policy's observation spec; an episode it cannot read is refused (:func:`check_readable`).

    Raises:
        ValueError: a path with no episodes (naming it).
        ConfigError: an episode the policy cannot read, or without a step limit (naming its path).
        CorruptEpisode / FileNotFoundError: as :func:`~rollcap.rollout.offline.inspect.iter_any`.
    """
    from rollcap.rollout.recording import iter_any
    cols: dict[str, list] = {k: [] for k in ("images", "state", "tokens", "chunks", "t", "human", "label_ok", "boundary", "plan", "episode", "final_image", "final_state", "final_tokens")}
    rows, runs = [], []
    for path in paths:
        n0 = len(rows)
        fps, seeds, digests = set(), [], []
        for rec in iter_any(path):
            if spec is not None:
                check_readable(rec, spec, str(path))
            one = episode_steps(rec, horizon, image_key, max_tokens, str(path))
            one["row"]["source"] = str(path)
            for k in ("images", "state", "tokens", "chunks", "t", "human", "label_ok", "boundary", "plan"):
                cols[k].append(one[k])
            cols["episode"].append(np.full(len(one["t"]), len(rows), np.int64))
            for k in ("final_image", "final_state", "final_tokens"):
                cols[k].append(one[k])
            rows.append(one["row"])
            seeds.append(int(rec.seed))
            digests.append(episode_digest(rec))
            made = {p: (rec.fingerprints.get(p) or {}).get("weights_digest") for p in ("policy", "critic")} | {"config": rec.config}
            fps.add(json.dumps(plain_json(made), sort_keys=True))
        if len(rows) == n0:
            raise ValueError(f"{path}: no episodes to learn from")
        runs.append({"path": str(path), "episodes": len(rows) - n0, "successes": sum(r["success"] for r in rows[n0:]),
                     "seeds_digest": _seeds_digest(seeds), "episodes_digest": _episodes_digest(digests), "made_with": [json.loads(x) for x in sorted(fps)]})  # fmt: skip
    cat = {k: np.concatenate(v) for k, v in cols.items() if k not in ("final_image", "final_state", "final_tokens")}
    steps = Steps(
        images=cat["images"], state=cat["state"], tokens=cat["tokens"].astype(np.int64), chunks=cat["chunks"].astype(np.float32),
        episode=cat["episode"], t=cat["t"].astype(np.int64), human=cat["human"].astype(bool), label_ok=cat["label_ok"].astype(bool),
        boundary=cat["boundary"].astype(bool), plan=cat["plan"].astype(np.float32), episodes=rows, final_images=np.stack(cols["final_image"]), final_state=np.stack(cols["final_state"]), final_tokens=np.stack(cols["final_tokens"]).astype(np.int64),
    )  # fmt: skip
    return steps, runs


def _seeds_digest(seeds: list[int]) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(np.asarray(sorted(seeds), np.int64).tobytes()).hexdigest()


def _episodes_digest(digests: list[str]) -> str:
    """sha256 over the run's episode digests in order (each an episode's identity, timings excluded)."""
    import hashlib

    return "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()


def collected_seeds(steps: Steps) -> set[int]:
    """Episode seeds of the rollouts (the held-out streams must avoid them)."""
    return {r["seed"] for r in steps.episodes}


def demo_config(seed: int, demos: int, policy_cfg=None):
    """The :class:`~rollcap.rollout.learn.training.TrainConfig` that regenerates ``demos`` shipped-style demonstrations
    (images, chunk length and tokens shaped for ``policy_cfg``, default the shipped policy's)."""
    from rollcap.rollout.learn.training import TrainConfig

    base = TrainConfig()
    return dataclasses.replace(base, seed=seed, demos=max(1, demos), policy=policy_cfg or base.policy)


def collect(paths, *, demos: int = 200, seed: int = 0, policy_cfg=None, log=lambda line: None) -> Collected:
    """Stage 1: the runs' episodes (:func:`read_runs`) and ``demos`` expert demonstrations, regenerated deterministically.

    The demonstrations are the shipped training's (:func:`~rollcap.rollout.learn.training.collect_demos`:
    the same expert mix, seeds ``episode_seed(seed + 1, i)``), so the fine-tune keeps seeing them.
    """
    from rollcap.rollout.learn.training import collect_demos

    tc = demo_config(seed, demos, policy_cfg)
    steps, runs = read_runs([Path(p) for p in paths], tc.policy.horizon, tc.policy.image_keys[0], tc.policy.max_tokens, tc.policy.obs_spec)
    log(f"collect: {len(steps.episodes)} episodes, {len(steps)} steps from {len(runs)} run(s); "
        f"{sum(r['success'] for r in steps.episodes)} successes, {sum(r['censored'] for r in steps.episodes)} censored, {int(steps.human.sum())} human steps")  # fmt: skip
    d = collect_demos(tc) if demos else None
    if d is not None:
        log(f"collect: {demos} demonstrations, {len(d.value)} steps, {d.episode_success.mean():.0%} successful")
    return Collected(steps, d, runs)
