"""Offline replay: prove a recorded episode reproduces byte-for-byte, or name where not.

Three modes, each per episode:

- ``policy``: feed every chunk boundary's recorded observation and noise through
  the captured policy (and critic) and compare the raw chunk (and value) bytes.
- ``env``: restore the recorded initial simulator state, apply the recorded
  actions, compare observations, rewards, flags and per-step sim states.
- ``closed``: re-run the whole episode from its seed through a fresh host and
  compare everything recorded except wall-clock latencies.

Exactness is only expected where the deployment fingerprints match; otherwise
the result says so and reports the largest deviation instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rollcap.envs import exact_state_of, physics_row
from rollcap.rollout.episode import ACTOR_AGENT, EpisodeRecord
from rollcap.rollout.protocols import observation_at, recorded_obs
from rollcap.rollout.offline.deployment import fingerprint_diff
from rollcap.rollout.recording.runs import source_index
from rollcap.rollout.seeding import chunk_noise

MODES = ("policy", "env", "closed")
FLOW_NAMES = ("step_noise", "trace", "logp")
"""What a stochastic sampler's chunk records beside it (``chunks/flow_<name>``), compared in policy mode."""
_TIMING = ("latency_policy_s", "latency_critic_s", "latency_boundary_s")


@dataclass
class Divergence:
    """The first place a replay differs from the recording."""

    key: str
    chunk: int | None = None
    step: int | None = None
    max_abs_diff: float = float("nan")

    def __str__(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in (("chunk", self.chunk), ("step", self.step)) if v is not None)
        return (
            f"{self.key} ({where}) max|diff| {self.max_abs_diff:.3g}"
            if where
            else f"{self.key} max|diff| {self.max_abs_diff:.3g}"
        )


STATUSES = ("exact", "diverged", "not comparable", "failed")


@dataclass
class ReplayResult:
    """Outcome of one mode on one episode; :attr:`status` is one of :data:`STATUSES`."""

    episode: int | None
    mode: str
    exact: bool
    divergence: Divergence | None = None
    fingerprint_diff: list[str] = field(default_factory=list)
    """Fingerprint fields that differ (exactness then not expected)."""
    max_abs_diff: float = 0.0
    note: str = ""
    error: str = ""
    """Why the episode could not be replayed at all (a damaged episode, an unusable recorded config)."""
    source: str = ""
    not_applicable: str = ""
    """Why this mode cannot check this episode at all (closed loop: the actions came from the caller); such a
    result is "not comparable" and counts neither for nor against the replay."""

    @classmethod
    def could_not(cls, source, mode: str, err: BaseException, episode: int | None = None) -> ReplayResult:
        """An episode that could not be replayed: reported, counted as failed, never as exact.

        A :class:`~rollcap.rollout.errors.ConfigError` about the recording says its problem only
        (it names the file; its field is a parameter name, not something the reader of a replay typed).
        """
        from rollcap.rollout.errors import ConfigError

        return cls(
            episode, mode, False, error=err.problem if isinstance(err, ConfigError) else str(err), source=str(source)
        )

    @property
    def status(self) -> str:
        if self.error:
            return "failed"
        if self.not_applicable:
            return "not comparable"
        if self.exact:
            return "exact"
        return "not comparable" if self.fingerprint_diff else "diverged"

    @property
    def failed(self) -> bool:
        """Diverged although the fingerprints matched."""
        return self.status == "diverged"

    def line(self) -> str:
        status = self.status
        if self.not_applicable:
            status = f"not comparable: {self.not_applicable}"
        elif status == "not comparable":
            status = f"not comparable bit-for-bit (fingerprint differs: {', '.join(self.fingerprint_diff[:4])}); max|diff| {self.max_abs_diff:.3g}"
        elif status == "diverged":
            status = f"DIVERGED at {self.divergence}"
        elif status == "failed":
            status = f"FAILED: {self.error}"
        extra = f" [{self.note}]" if self.note else ""
        which = "   ?" if self.episode is None else f"{self.episode:>4}"
        return f"episode {which} {self.mode:<7} {status}{extra}"


def summary_line(results: list[ReplayResult], accept_not_comparable: bool = False) -> tuple[str, bool]:
    """The closing line (counts per status) and whether the replay passed.

    It passes only when every result is exact (or, with ``accept_not_comparable``,
    not comparable): an episode that was skipped or could not be read never counts as exact. A mode that does not
    apply to an episode (:attr:`ReplayResult.not_applicable`) is left out, as long as some mode checked something.
    """
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    inapplicable = sum(bool(r.not_applicable) for r in results)
    episodes = len({(r.source, r.episode) for r in results if r.episode is not None})
    files = sum(r.episode is None for r in results)  # unreadable as a whole (no episode to name)
    modes = sorted({r.mode for r in results if r.mode != "all"})
    ok = (
        bool(results)
        and counts["diverged"] == counts["failed"] == 0
        and (accept_not_comparable or counts["not comparable"] == inapplicable)
        and inapplicable < len(results)
    )
    text = ", ".join(f"{n} {s}" for s, n in counts.items())
    if inapplicable:
        text += f" ({inapplicable} of them: a mode that does not apply, actions came from the caller)"
    unread = f" and {files} unreadable file(s)" if files else ""
    return f"{episodes} episode(s){unread}, {len(modes)} mode(s): {text}" + (
        " -- all exact" if counts["exact"] == len(results) and results else ""
    ), ok


def _cmp(key: str, got: np.ndarray, want: np.ndarray, **where) -> Divergence | None:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes():
        return None
    if got.shape != want.shape:
        return Divergence(f"{key} shape {got.shape} vs {want.shape}", **where)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return Divergence(key, max_abs_diff=float(np.nanmax(diff)) if diff.size else 0.0, **where)


def replay_policy(rec: EpisodeRecord, policy, critic=None) -> ReplayResult:
    """Mode ``policy``: recorded observations + noise through the policy (and the critic, if the episode had one).

    ``policy`` / ``critic`` follow :class:`~rollcap.rollout.protocols.ChunkPolicy` /
    :class:`~rollcap.rollout.protocols.ChunkCritic`. A real-time-chunking
    episode's chunks are each fed the carried prefix recorded with them; a stochastic sampler's (``flow_*`` chunk
    arrays) has each chunk's step noise, trace and log-probabilities compared too.
    """
    policy, carried = _policy_for(rec, policy), rec.chunks.get("rtc_carried")
    fp = fingerprint_diff(rec.fingerprints.get("policy", {}), policy.state_fingerprint())
    critic = critic if "critic" in rec.fingerprints else None  # an episode run without a critic has no values to check
    if critic is not None:
        fp += [f"critic.{k}" for k in fingerprint_diff(rec.fingerprints["critic"], critic.state_fingerprint())]
    first, worst = None, 0.0
    flow = getattr(policy, "chunk_flow", None) if "flow_logp" in rec.chunks else None
    policy.reset()
    for k in range(rec.num_chunks):
        obs = observation_at(rec, int(rec.chunks["chunk_start"][k]))
        if carried is not None:  # real-time chunking: the prefix this chunk was guided by, as recorded
            policy.load_carried(carried[k], rec.chunks["rtc_weights"][k], 0)
        policy.start(obs, rec.chunks["noise"][k])
        checks = [("policy_chunk", policy.result(), rec.chunks["policy_chunk"][k])]
        if flow is not None:  # a stochastic sampler's episode: each step's noise, the trace and the log-probabilities
            got = flow()
            checks += [(f"flow_{name}", got[name], rec.chunks[f"flow_{name}"][k]) for name in FLOW_NAMES]
        if critic is not None:
            critic.start(obs)
            checks.append(("critic_value", np.float32(critic.result()), rec.chunks["critic_value"][k]))
        for key, got, want in checks:
            d = _cmp(key, got, want, chunk=k)
            if d is not None:
                worst = max(worst, d.max_abs_diff if np.isfinite(d.max_abs_diff) else float("inf"))
                first = first or d
    return ReplayResult(rec.index, "policy", first is None, first, fp, worst)


def replay_env(rec: EpisodeRecord, env) -> ReplayResult:
    """Mode ``env``: restore the initial sim state and apply the recorded actions."""
    layer = exact_state_of(env)
    if layer is None or not rec.initial_state:
        return ReplayResult(
            rec.index,
            "env",
            False,
            Divergence("env has no exact state"),
            ["env.exact_state"],
            float("nan"),
            "skipped: the env has no exact state to restore",
        )
    fp = (
        [f"env.{k}" for k in fingerprint_diff(rec.fingerprints.get("env", {}), layer.state_fingerprint())]
        if hasattr(layer, "state_fingerprint")
        else []
    )
    obs, _ = env.reset(seed=rec.seed)  # the recorded episode began from this reset, then its exact state
    layer.set_state(rec.initial_state)
    if rec.origin is not None:  # began at another episode's boundary (a branch): it saw the recorded observation there
        obs = observation_at(rec, 0)
    first, worst = None, 0.0

    def note(d):
        nonlocal first, worst
        if d is not None:
            worst = max(worst, d.max_abs_diff if np.isfinite(d.max_abs_diff) else float("inf"))
            first = first or d

    for t in range(rec.num_steps):
        for k, v in rec.obs.items():
            note(_cmp(f"obs/{k}", recorded_obs(obs)[k], v[t], step=t))
        note(_cmp("states", physics_row(layer.get_state()), rec.steps["states"][t], step=t))
        obs, r, term, trunc, _ = env.step(rec.steps["actions"][t])
        note(_cmp("rewards", np.float64(r), rec.steps["rewards"][t], step=t))
        note(_cmp("terminated", np.bool_(term), rec.steps["terminated"][t], step=t))
        note(_cmp("truncated", np.bool_(trunc), rec.steps["truncated"][t], step=t))
    for k, v in rec.final_obs.items():
        note(_cmp(f"final_obs/{k}", recorded_obs(obs)[k], v, step=rec.num_steps))
    return ReplayResult(rec.index, "env", first is None, first, fp, worst)


def _policy_for(rec: EpisodeRecord, policy):
    """The runner that replays ``rec``: a real-time-chunking episode needs one that carries a prefix."""
    if "rtc_carried" not in rec.chunks or callable(getattr(policy, "load_carried", None)):
        return policy
    from rollcap.policies.rtc import rtc_twin

    if not hasattr(policy, "model"):
        raise ValueError(f"episode {rec.index} used real-time chunking; {type(policy).__name__} carries no prefix")
    return rtc_twin(policy)


OWN_STOPS = frozenset(
    {"success", "terminated", "truncated", "error", "critic", "timeout_chunks", "timeout_seconds", "nonfinite_action"}
)
"""Stop reasons the host and its predicates reach by themselves; any other came from outside (a key, a caller)."""


def closed_loop_host(rec: EpisodeRecord, env, policy, critic=None):
    """A host that re-runs ``rec`` from its seed, re-issuing its recorded outside inputs when it had any.

    An intervened episode (human steps) or one stopped from outside gets the
    recorded takeover actions and stop through :class:`~rollcap.rollout.teleop.replay.ReplayInputs`;
    an ordinary episode runs with no inputs at all, so a divergence cannot be masked.
    """
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.episode import ACTOR_HUMAN
    from rollcap.rollout.events import EventBus
    from rollcap.rollout.host import RolloutHost

    critic = critic if "critic" in rec.fingerprints else None
    config = HostConfig.from_json(rec.config)
    policy = _policy_for(rec, policy)
    if rec.stop_reason in OWN_STOPS and not (np.asarray(rec.steps["actor"]) == ACTOR_HUMAN).any():
        return RolloutHost(env, policy, critic, config)
    from rollcap.rollout.teleop.replay import ReplayInputs

    bus = EventBus()
    return RolloutHost(env, policy, critic, config, [ReplayInputs(rec, bus)], events=bus)


def caller_actions(rec: EpisodeRecord) -> str:
    """Why a closed-loop re-run cannot reproduce ``rec`` whatever the code does: its actions came from the caller
    (an agent's chunks through ``ChunkEnv``, or the flow noise an agent chose through ``NoiseSteeringEnv``: a
    re-run draws every chunk's noise from the episode seed). "" for an episode the host drove itself."""
    if (np.asarray(rec.steps["actor"]) == ACTOR_AGENT).any():
        return "actions came from the caller (an agent's chunks)"
    if rec.origin is None:  # a branch takes its first chunks' noise from its parent; it is checked as it was
        noise = rec.chunks["noise"]
        if any(not np.array_equal(chunk_noise(rec.seed, k, noise.shape[1:]), noise[k]) for k in range(len(noise))):
            return "actions came from the caller (the noise an agent chose)"
    return ""


def replay_closed(rec: EpisodeRecord, host) -> ReplayResult:
    """Mode ``closed``: re-run the episode from its seed and compare the whole record (not comparable, without
    running, for an episode whose actions came from the caller: :func:`caller_actions`)."""
    why = caller_actions(rec)
    if why:
        return ReplayResult(rec.index, "closed", False, not_applicable=why)
    fp = fingerprint_diff(rec.fingerprints.get("policy", {}), host.policy.state_fingerprint())
    from rollcap.rollout.resume import resume_of

    new = host.run_episode(rec.index, rec.seed, resume_of(rec)).record  # a branch starts at its recorded boundary
    first, worst = None, 0.0
    pairs = [
        (
            "stop_reason",
            np.frombuffer(new.stop_reason.encode(), np.uint8),
            np.frombuffer(rec.stop_reason.encode(), np.uint8),
        )
    ]
    pairs += [(f"steps/{k}", new.steps[k], rec.steps[k]) for k in rec.steps]
    pairs += [(f"chunks/{k}", new.chunks.get(k, np.zeros(0)), rec.chunks[k]) for k in rec.chunks if k not in _TIMING]
    pairs += [(f"obs/{k}", new.obs.get(k, np.zeros(0)), v) for k, v in rec.obs.items()]
    pairs += [(f"initial_state/{k}", new.initial_state.get(k, np.zeros(0)), v) for k, v in rec.initial_state.items()]
    for key, got, want in pairs:
        d = _cmp(key, got, want)
        if d is not None:
            worst = max(worst, d.max_abs_diff if np.isfinite(d.max_abs_diff) else float("inf"))
            first = first or d
    return ReplayResult(rec.index, "closed", first is None, first, fp, worst)


class Replayer:
    """One policy and critic for a whole replay, and one env per recorded (env id, kwargs); checks an episode at a time.

    ``rollcap replay`` uses one in this process; with ``--actors`` each Ray
    actor is one (:class:`~rollcap.rollout.ray.replay.ReplayActor`).
    """

    def __init__(self, parts):
        from rollcap.rollout.build import make_runners

        self.parts = parts
        self.policy, self.critic = make_runners(parts)
        self.envs: dict[str, object] = {}
        self.experts: dict[str, object] = {}
        self.batched: dict[int, tuple] = {}  # batch -> (policy, critic) runners, for batched recordings

    def policy_for(self, rec: EpisodeRecord, source: str, import_env: bool = False):
        """The policy that replays ``rec``: ``expert[:STD]`` is the expert of the recording's env, built with its
        kwargs as ``rollcap run`` built it (one per env, :meth:`env_for`'s), any other the one policy."""
        from rollcap.rollout.spec import named_policy
        from rollcap.rollout.named import expert_policy

        named = named_policy(self.parts.policy)
        if named is None or named[0] != "expert":
            return self.policy
        env = self.env_for(rec, source, import_env)
        if id(env) not in self.experts:
            self.experts[id(env)] = expert_policy(named[1], env)
        return self.experts[id(env)]

    # -- batched recordings (issue 34): the runners at the recorded batch ------------------
    def runners_for(self, rec: EpisodeRecord, source: str, import_env: bool = False):
        """The policy and critic that replay ``rec``: for an episode of a batched run (``batch`` in its policy
        fingerprint) a row of runners captured at that batch (built once per batch), else :meth:`policy_for`'s and the one critic."""
        from rollcap.rollout.batch import recorded_batch, row_views

        batch = recorded_batch(rec.fingerprints)
        if batch == 1:
            return self.policy_for(rec, source, import_env), self.critic
        if batch not in self.batched:
            from rollcap.rollout.build import make_runners

            self.batched[batch] = make_runners(self.parts, envs=batch)
        return row_views(*self.batched[batch])

    def env_for(self, rec: EpisodeRecord, source: str, import_env: bool = False):
        """The recording's env (built once per id and kwargs). ``import_env``: the user named a ``module:Env`` id, so it may be imported."""
        import json

        from rollcap.rollout.build import make_env

        key = json.dumps([rec.env_id, rec.env_kwargs], sort_keys=True)
        if key not in self.envs:
            self.envs[key] = make_env(rec.env_id, rec.env_kwargs, source=None if import_env else source)
        return self.envs[key]

    def check(self, source: str, rec: EpisodeRecord | Exception, modes, import_env: bool = False) -> list[ReplayResult]:
        """Replay ``rec`` in each of ``modes``; a mode that cannot run on it is reported as failed, the others still run.

        ``rec`` may be the error an unreadable episode came back as (:func:`iter_episodes`): one failed result.
        """
        if isinstance(rec, Exception):
            return [ReplayResult.could_not(source, "all", rec, source_index(source))]
        out = []
        for mode in modes:
            try:
                policy, critic = self.runners_for(rec, source, import_env)
                if mode == "policy":
                    res = replay_policy(rec, policy, critic)
                else:
                    env = self.env_for(rec, source, import_env)
                    res = (
                        replay_env(rec, env)
                        if mode == "env"
                        else replay_closed(rec, closed_loop_host(rec, env, policy, critic))
                    )
            except (ValueError, KeyError, TypeError) as err:
                res = ReplayResult.could_not(source, mode, err, rec.index)
            res.source = str(
                source
            )  # every mode's result names the episode's file: the summary counts episodes by (file, index)
            out.append(res)
        return out

    def close(self) -> None:
        for part in (
            self.policy,
            self.critic,
            *self.envs.values(),
            *(r for pair in self.batched.values() for r in pair),
        ):
            if part is not None:
                part.close()
