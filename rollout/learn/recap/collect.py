"""RECAP stage 1, collect: a run's recorded episodes as flat training steps, plus the shipped demonstrations.

Each episode of a run directory (local, Ray, teleop or branch runs alike; read
one at a time through :func:`~rollcap.rollout.recording.iter_any`) becomes its
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
from rollcap.rollout.episode import ACTOR_HUMAN, NATURAL_ENDS
from rollcap.rollout.recording.codec import episode_digest


@dataclass
class Steps:
    """Flat per-step arrays over a set of episodes (rollouts or demonstrations)."""

    images: (
        np.ndarray
    )  # [N, S, S, 3] uint8, observation before step t ([N, 0] for a state-only model: see value.image_inputs)
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
    plan: np.ndarray | None = (
        None  # [N, H, A] at a boundary: the chunk run from it (its executed actions as the env got them, then the rest as planned)
    )

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
    shown: Demonstrations | None = None
    """The demonstrations' seeds and how to regenerate them."""


def _max_steps(rec, source: str = "") -> int:
    from rollcap.rollout.offline.branch import max_steps_of

    return max_steps_of(rec, source=source)


def check_readable(rec, obs_spec, source: str = "") -> None:
    """Refuse an episode whose observations a policy with observation obs_spec ``obs_spec`` cannot read (recap learns on them).

    Raises:
        ConfigError: (field ``runs``) naming the file, the env and what it recorded against what the policy reads.
    """
    from rollcap.rollout.errors import ConfigError

    want = {k: (obs_spec.image_size, obs_spec.image_size, 3) for k in obs_spec.image_keys} | {
        "state": (obs_spec.state_dim,)
    }
    have = {k: tuple(np.shape(v)) for k, v in rec.final_obs.items()}
    if any(have.get(k) != shape for k, shape in want.items()):
        where = f"{source}: " if source else ""
        recorded = ", ".join(f"{k} {v}" for k, v in have.items()) or "nothing"
        needed = ", ".join(f"{k} {v}" for k, v in want.items())
        raise ConfigError("runs", f"{where}episode {rec.index} was recorded in {rec.env_id}, whose observations the policy cannot read "
                          f"(recorded {recorded}; it reads {needed}): recap learns only from runs of an env the policy reads")  # fmt: skip


def episode_steps(rec, horizon: int, image_key: str | None, max_tokens: int, source: str = "") -> dict:
    """One episode's per-step arrays and its row (see :class:`Steps`); ``source``: its file, named in errors.

    ``image_key`` None: a state-only model's steps (``images`` ``[T, 0]``, see :class:`Steps`).
    """
    from rollcap.policies import tokenize

    t_len = rec.num_steps
    acts = rec.steps["actions"].astype(np.float32)
    pad = np.concatenate([acts, np.zeros((horizon, acts.shape[1]), np.float32)])
    chunks = (
        np.stack([pad[t : t + horizon] for t in range(t_len)])
        if t_len
        else np.zeros((0, horizon, acts.shape[1]), np.float32)
    )
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
        "images": _images(rec, image_key, t_len), "state": _per_step(rec, "state", t_len).astype(np.float32),
        "tokens": np.repeat(tokens[None], t_len, 0), "chunks": chunks, "t": np.arange(t_len), "human": rec.steps["actor"] == ACTOR_HUMAN,
        "label_ok": label_ok, "boundary": boundary, "plan": plan, "row": row, "final_image": np.zeros(0, np.uint8) if image_key is None else np.asarray(rec.final_obs[image_key], np.uint8),
        "final_state": np.asarray(rec.final_obs["state"], np.float32), "final_tokens": tokens,
    }  # fmt: skip


def _images(rec, key: str | None, t_len: int) -> np.ndarray:
    """One camera's images before each step, uint8 ``[T, S, S, 3]``; ``[T, 0]`` for a state-only model (``key`` None)."""
    return np.zeros((t_len, 0), np.uint8) if key is None else _per_step(rec, key, t_len).astype(np.uint8)


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
    return {
        "parent": str(o.get("parent", o.get("file", ""))),
        "episode": int(o.get("episode", -1)),
        "chunk": int(o.get("chunk", -1)),
    }


def read_runs(
    paths, horizon: int = 8, image_key: str | None = "image_front", max_tokens: int = 48, obs_spec=None
) -> tuple[Steps, list[dict]]:
    """Every episode of the run directories (or recording files) ``paths``, streamed, as :class:`Steps`.

    ``image_key``: the camera a model reads (None: a state-only model's steps, ``images`` ``[N, 0]``).

    ``obs_spec``: the policy's observation spec; an episode it cannot read is refused (:func:`check_readable`).

    Raises:
        ValueError: a path with no episodes (naming it).
        ConfigError: an episode the policy cannot read, or without a step limit (naming its path).
        CorruptEpisode / FileNotFoundError: as :func:`~rollcap.rollout.recording.iter_any`.
    """
    from rollcap.rollout.recording import iter_any

    acc = StepsBuilder(horizon, image_key, max_tokens, obs_spec)
    runs = []
    for path in paths:
        n0 = len(acc.rows)
        fps, seeds, digests = set(), [], []
        for rec in iter_any(path):
            acc.add(rec, str(path))
            seeds.append(int(rec.seed))
            digests.append(episode_digest(rec))
            made = {p: (rec.fingerprints.get(p) or {}).get("weights_digest") for p in ("policy", "critic")} | {
                "config": rec.config
            }
            fps.add(json.dumps(plain_json(made), sort_keys=True))
        if len(acc.rows) == n0:
            raise ValueError(f"{path}: no episodes to learn from")
        rows = acc.rows[n0:]
        runs.append({"path": str(path), "episodes": len(rows), "successes": sum(r["success"] for r in rows),
                     "seeds_digest": _seeds_digest(seeds), "episodes_digest": _episodes_digest(digests), "made_with": [json.loads(x) for x in sorted(fps)]})  # fmt: skip
    return acc.steps(), runs


class StepsBuilder:
    """Episodes (records) in, :class:`Steps` out: what :func:`read_runs` does for files, for records held in memory too."""

    PER_STEP = ("images", "state", "tokens", "chunks", "t", "human", "label_ok", "boundary", "plan")
    FINAL = ("final_image", "final_state", "final_tokens")

    def __init__(self, horizon: int = 8, image_key: str | None = "image_front", max_tokens: int = 48, obs_spec=None):
        self.horizon, self.image_key, self.max_tokens, self.obs_spec = horizon, image_key, max_tokens, obs_spec
        self.cols: dict[str, list] = {k: [] for k in (*self.PER_STEP, "episode", *self.FINAL)}
        self.rows: list[dict] = []

    def add(self, rec, source: str = "") -> None:
        """One episode (refused as :func:`check_readable` says when an ``obs_spec`` was given); ``source`` names it in errors and rows."""
        if self.obs_spec is not None:
            check_readable(rec, self.obs_spec, source)
        one = episode_steps(rec, self.horizon, self.image_key, self.max_tokens, source)
        one["row"]["source"] = source
        for k in self.PER_STEP:
            self.cols[k].append(one[k])
        self.cols["episode"].append(np.full(len(one["t"]), len(self.rows), np.int64))
        for k in self.FINAL:
            self.cols[k].append(one[k])
        self.rows.append(one["row"])

    def steps(self) -> Steps:
        """Everything added, as one :class:`Steps`."""
        cat = {k: np.concatenate(self.cols[k]) for k in (*self.PER_STEP, "episode")}
        return Steps(
            images=cat["images"], state=cat["state"], tokens=cat["tokens"].astype(np.int64), chunks=cat["chunks"].astype(np.float32),
            episode=cat["episode"], t=cat["t"].astype(np.int64), human=cat["human"].astype(bool), label_ok=cat["label_ok"].astype(bool),
            boundary=cat["boundary"].astype(bool), plan=cat["plan"].astype(np.float32), episodes=self.rows, final_images=np.stack(self.cols["final_image"]),
            final_state=np.stack(self.cols["final_state"]), final_tokens=np.stack(self.cols["final_tokens"]).astype(np.int64),
        )  # fmt: skip


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


@dataclass
class Demonstrations:
    """Scripted demonstrations mixed into the refit and the fine-tune, and how they were made."""

    demos: object | None
    """:class:`~rollcap.rollout.learn.training.Demos` (None: no demonstrations)."""
    seeds: set[int]
    """Their episode seeds (the held-out streams must avoid them)."""
    rule: str
    """How to regenerate them (recorded in the manifest)."""


def demonstrations(env_ids: set[str], demos: int, seed: int, policy_cfg=None) -> Demonstrations:
    """``demos`` demonstrations of the scripted expert of the runs' envs, regenerated deterministically from ``seed``.

    The built-in task: the shipped policy's training demonstrations (:func:`~rollcap.rollout.learn.training.collect_demos`,
    seeds ``episode_seed(seed + 1, i)``). MetaWorld MT10 tasks: the MT10 policy's DART demonstrations of those tasks
    (:func:`~rollcap.rollout.learn.mt10.recap_demos`, ``demos`` split evenly over the tasks). With ``seed`` 0 either is
    what the shipped checkpoint was trained on, so the fine-tune keeps seeing it.

    Raises:
        ConfigError: (field ``demos``) the runs' envs have no scripted demonstrations here, or mix two families.
    """
    from rollcap.rollout.spec import DEFAULT_ENV
    from rollcap.rollout.errors import ConfigError

    if not demos:
        return Demonstrations(None, set(), "none")
    if env_ids == {DEFAULT_ENV}:
        from rollcap.rollout.learn.training import collect_demos
        from rollcap.rollout.seeding import episode_seed

        return Demonstrations(collect_demos(demo_config(seed, demos, policy_cfg)), {episode_seed(seed + 1, i) for i in range(demos)},
                              f"training.collect_demos(TrainConfig(seed={seed}, demos={demos}))")  # fmt: skip
    from rollcap.envs.metaworld import ID_PREFIX, MT10

    tasks = sorted(e.removeprefix(ID_PREFIX) for e in env_ids)
    if all(e.startswith(ID_PREFIX) for e in env_ids) and all(t in MT10 for t in tasks):
        from rollcap.rollout.learn.mt10 import recap_demos

        return Demonstrations(*recap_demos(tasks, demos, seed, policy_cfg))
    raise ConfigError("demos", f"no scripted demonstrations for {', '.join(sorted(env_ids))} (there are for {DEFAULT_ENV} and the "
                      "MetaWorld MT10 tasks, one family at a time); learn from the runs alone with `demos=0`")  # fmt: skip


def collect(paths, *, demos: int = 200, seed: int = 0, policy_cfg=None, log=lambda line: None) -> Collected:
    """Stage 1: the runs' episodes (:func:`read_runs`) and ``demos`` expert demonstrations of their envs (:func:`demonstrations`)."""
    pc = policy_cfg or demo_config(seed, demos).policy
    steps, runs = read_runs(
        [Path(p) for p in paths], pc.horizon, pc.image_keys[0] if pc.image_keys else None, pc.max_tokens, pc.obs_spec
    )
    log(f"collect: {len(steps.episodes)} episodes, {len(steps)} steps from {len(runs)} run(s); "
        f"{sum(r['success'] for r in steps.episodes)} successes, {sum(r['censored'] for r in steps.episodes)} censored, {int(steps.human.sum())} human steps")  # fmt: skip
    shown = demonstrations({r["task"] for r in steps.episodes}, demos, seed, pc)
    if shown.demos is not None:
        log(
            f"collect: {demos} demonstrations, {len(shown.demos.value)} steps, {shown.demos.episode_success.mean():.0%} successful"
        )
    return Collected(steps, shown.demos, runs, shown)
