"""The training loop: groups on the batched Flow-SDE graph, an update, the new weights into the graph in place.

One iteration:

1. ``groups`` capsules (initial states of the training stream), ``group_size`` episodes each, as one batch on the
   Flow-SDE graph (:class:`~rollcap.rollout.learn.flow_rl.rollouts.GroupRollouts`); each chunk comes back with its
   trace and per-step log-probabilities (:mod:`rollcap.policies.flow_sde`);
2. advantages (:mod:`~rollcap.rollout.learn.flow_rl.advantages`): GRPO's group-relative outcome, PPO's GAE with a
   value head, or the branch variant (continuations from one boundary of each episode);
3. one update (:class:`~rollcap.rollout.learn.flow_rl.learner.FlowLearner`); chunks with zero advantage (a group
   whose episodes all ended alike) are left out;
4. the learner's weights copied into the rollout graph's parameters in place
   (:meth:`~rollcap.kernels.runner.GraphRunner.load_weights`): no recapture; every episode's fingerprint names the
   weights digest it ran with.

Every ``heldin_every`` iterations the plain sampler (the deployed policy, its own noise) plays the held-in stream
with the current weights (its own graph, new weights in place too), paired against the starting weights; the best
by that score is kept (keep-best). Every ``record_every`` iterations that iteration's episodes are recorded
(``out/episodes``, npz) and the weights they ran with saved (``out/weights``), so each replays exactly in a fresh
process (:mod:`~rollcap.rollout.learn.flow_rl.store`). A Ctrl-C saves the state of the last finished iteration
(``out/state``; also saved at every held-in checkpoint) and ``resume`` goes on from it: every iteration's episodes
and minibatches derive from (seed, iteration), so a resumed run is the run that did not stop.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rollcap.kernels.graph import capture_count
from rollcap.policies.runner import load_policy
from rollcap.rollout.learn.dsrl_eval import TASKS
from rollcap.rollout.learn.flow_rl.advantages import Advantages
from rollcap.rollout.learn.flow_rl.config import TrainConfig
from rollcap.rollout.learn.flow_rl.learner import FlowLearner
from rollcap.rollout.learn.flow_rl.rollouts import GroupRollouts, HeldInScore
from rollcap.rollout.learn.flow_rl.store import load_state, save_state, save_weights
from rollcap.rollout.recording.recorder import EpisodeRecorder
from rollcap.rollout.spec import shipped_models


BUDGET = ("minutes", "max_iterations", "log_every_s")
"""The settings a resumed run may change (its budget); any other must be the saved one."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`train`: the state of iteration ``iteration`` was saved; ``train(..., resume=True)`` goes on."""

    def __init__(self, iteration: int, out: Path):
        super().__init__(
            f"interrupted; the state after iteration {iteration} is in {Path(out) / 'state'} (resume goes on from it)"
        )
        self.iteration, self.out = iteration, out


def start_checkpoint(cfg: TrainConfig, policy=None) -> Path:
    """The checkpoint a run starts from: ``policy``, else the shipped one for the task's env."""
    return Path(policy) if policy is not None else Path(shipped_models(TASKS[cfg.task].env_id)[0])


@dataclass
class Progress:
    """What a run has done so far (saved with its state; JSON)."""

    iteration: int = 0
    seconds: float = 0.0
    budget: dict = field(default_factory=lambda: {
        "iterations": 0, "episodes": 0, "transitions": 0, "env_steps": 0, "updates": 0, "trained_chunks": 0,
        "branch_episodes": 0, "rollout_seconds": 0.0, "update_seconds": 0.0, "held_in_seconds": 0.0})  # fmt: skip
    curve: list = field(default_factory=list)
    held_in: list = field(default_factory=list)
    kept: dict | None = None
    recorded: list = field(default_factory=list)
    """``[iteration, episode indices, weights digest, weights file]`` of every recorded iteration."""


class Trainer:
    """One flow-RL run (see the module docstring); :meth:`run` trains and returns the result."""

    def __init__(self, cfg: TrainConfig, out: Path, policy=None, progress=print, resume: bool = False):
        self.cfg, self.out, self.say = cfg, Path(out), progress
        self.task = TASKS[cfg.task]
        self.start = start_checkpoint(cfg, policy)
        self.resume = resume
        self.rollouts = self.heldin = self.recorder = None
        self.p = Progress()
        self.kept_state: dict | None = None

    # -- building ------------------------------------------------------------------
    def _build(self) -> None:
        cfg = self.cfg
        self.captures0 = capture_count()
        self.rollouts = GroupRollouts(
            self.task, self.start, cfg.groups, cfg.group_size, cfg.noise_level, cfg.seed, cfg.threads, cfg.max_start
        )
        if cfg.heldin_every:
            self.heldin = HeldInScore(
                self.task, self.start, cfg.seed, cfg.heldin_episodes, cfg.heldin_envs, cfg.threads
            )
        self.graphs = capture_count() - self.captures0
        model = load_policy(self.start)
        self.learner = FlowLearner(copy.deepcopy(model), cfg.noise_level, cfg.lr, cfg.clip, cfg.epochs, cfg.minibatch,
                                   cfg.max_grad_norm, cfg.train, cfg.seed)  # fmt: skip
        self.advantages = Advantages(cfg, model.cfg.obs_spec, self.task)
        if cfg.record_every:
            self.recorder = EpisodeRecorder(self.out, formats=("npz",), resume=True)

    def _modules(self) -> tuple[dict, dict]:
        mods = {"policy": self.learner.model, **self.advantages.modules()}
        opts = {"policy_opt": self.learner.opt, **self.advantages.optimizers()}
        return mods, opts

    def _snapshot(self) -> None:
        """The state after the iteration that just finished, in memory (a Ctrl-C mid-iteration saves this)."""
        mods, opts = self._modules()
        self._last = (
            {n: {k: v.detach().clone() for k, v in m.state_dict().items()} for n, m in mods.items()},
            {n: copy.deepcopy(o.state_dict()) for n, o in opts.items()},
            copy.deepcopy(self._meta()),  # the curve and budget go on growing in place
            self.kept_state,  # replaced, never changed in place
        )

    def _meta(self) -> dict:
        p = self.p
        return {"config": self.cfg.to_json(), "start": str(self.start), "iteration": p.iteration, "seconds": p.seconds,
                "budget": p.budget, "curve": p.curve, "held_in": p.held_in, "kept": p.kept, "recorded": p.recorded,
                "updates": self.learner.updates}  # fmt: skip

    def save(self, last: bool = True) -> None:
        """Write the training state (``last``: the snapshot of the last finished iteration, else the live one)."""
        mods, opts = self._modules()
        kept = self.kept_state
        if last and getattr(self, "_last", None) is not None:
            weights, opt_states, meta, kept = self._last
            mods = {n: _Holder(w) for n, w in weights.items()}
            opts = {n: _Holder(s) for n, s in opt_states.items()}
        else:
            meta = self._meta()
        extra = {"kept": kept} if kept is not None else {}
        save_state(self.out, mods, opts, extra, meta)

    def _load(self) -> None:
        mods, opts = self._modules()
        meta, extra = load_state(self.out, mods, opts)
        now = self.cfg.to_json()
        changed = sorted(k for k in meta["config"] if k not in BUDGET and meta["config"][k] != now.get(k))
        if changed or meta["start"] != str(self.start):
            raise ValueError(f"{self.out / 'state'}: saved by a run with other settings ({', '.join(changed) or 'the starting policy'}); resume with the same ones")  # fmt: skip
        p = self.p
        p.iteration, p.seconds, p.budget, p.curve = meta["iteration"], meta["seconds"], meta["budget"], meta["curve"]
        p.held_in, p.kept, p.recorded = meta["held_in"], meta["kept"], meta["recorded"]
        self.learner.updates = meta["updates"]
        self.kept_state = extra.get("kept")
        self._load_weights()
        self.say(
            f"resumed after iteration {p.iteration} ({p.seconds / 60:.1f} of {self.cfg.minutes:g} minutes, weights {self.rollouts.runner.weights_digest[:19]})"
        )

    def _load_weights(self) -> str:
        """The learner's weights into the rollout graph (and the held-in one), in place; returns their digest."""
        sd = self.learner.model.state_dict()
        digest = self.rollouts.runner.load_weights(sd)
        if self.heldin is not None:
            self.heldin.runner.load_weights(sd, digest)
        return digest

    # -- the loop ------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(cfg.threads)
        try:
            self._build()
            if self.resume:
                self._load()
            elif self.heldin is not None:
                self._checkpoint()
            self._snapshot()
            t_start, done_before = time.perf_counter(), self.p.seconds
            last_log = 0.0
            try:
                while self.p.iteration < cfg.max_iterations and self.p.seconds < 60 * cfg.minutes:
                    self._iteration()
                    self.p.seconds = done_before + time.perf_counter() - t_start
                    point = self.p.curve[-1]
                    if cfg.log_every_s == 0 or time.perf_counter() - last_log >= cfg.log_every_s:
                        last_log = time.perf_counter()
                        self.say(" ".join(f"{k}={v}" for k, v in point.items()))
                    if self.heldin is not None and self.p.iteration % cfg.heldin_every == 0:
                        self._checkpoint()
                    self._snapshot()
                    if self.heldin is not None and self.p.iteration % cfg.heldin_every == 0:
                        self.save()
                if self.heldin is not None and self.p.held_in[-1]["iteration"] != self.p.iteration:
                    self._checkpoint()
                    self._snapshot()
            except KeyboardInterrupt:
                self.save()
                raise Interrupted(self._last[2]["iteration"], self.out) from None
            self.save()
            return self._result()
        finally:
            for part in (self.rollouts, self.heldin):
                if part is not None:
                    part.close()
            if self.recorder is not None:
                self.recorder.close()
            torch.set_num_threads(threads)

    def _iteration(self) -> None:
        cfg, p, b = self.cfg, self.p, self.p.budget
        it = p.iteration
        t1 = time.perf_counter()
        items = self.rollouts.items(it)
        episodes, ends = self.rollouts.run(items, self.advantages.on_round(self.rollouts, it))
        branch = self.advantages.continuations(self.rollouts, it)
        t2 = time.perf_counter()
        digest = self.rollouts.runner.weights_digest
        if cfg.record_every and it % cfg.record_every == 0:
            self._record(it, ends, digest)
        batch, info = self.advantages.batch(episodes, branch)
        if cfg.max_start:
            info["start_chunk"] = round(float(np.mean(self.rollouts.start_chunks)), 2)
            info["scout_chunks"], scout_steps = self.rollouts.scout_cost
            b["env_steps"] += scout_steps
        stats = self.learner.update(batch) if batch is not None else {}
        stats.update(self.advantages.update_value(episodes))
        self._load_weights()
        t3 = time.perf_counter()
        p.iteration = it + 1
        b["iterations"] = p.iteration
        b["episodes"] += len(episodes)
        b["transitions"] += info["chunks"] + info.get("scout_chunks", 0)
        b["env_steps"] += int(sum(e.steps for e in episodes))
        b["branch_episodes"] += info.get("branch_episodes", 0)
        b["updates"] += batch is not None
        b["trained_chunks"] += info.get("trained_chunks", 0)
        b["rollout_seconds"] += t2 - t1
        b["update_seconds"] += t3 - t2
        p.curve.append({"iteration": p.iteration, "seconds": round(p.seconds + (t3 - t1), 1), "transitions": b["transitions"],
                        **info, **{k: round(v, 5) for k, v in stats.items()}, "weights": digest[:19],
                        "rollout_s": round(t2 - t1, 1), "update_s": round(t3 - t2, 1)})  # fmt: skip

    def _record(self, it: int, ends, digest: str) -> None:
        """The iteration's episodes into ``out/episodes`` and the weights they ran with into ``out/weights``."""
        path = save_weights(self.learner.model, self.out, digest)
        have = set(self.recorder.indices)
        records = [e.record for e in ends if e.record is not None and e.index not in have]
        if records:
            self.recorder.write_many(records)
        entry = [it, [e.index for e in ends], digest, str(path.relative_to(self.out))]
        if entry not in self.p.recorded:
            self.p.recorded.append(entry)

    def _checkpoint(self) -> None:
        """The held-in score of the weights the graphs hold now; keep-best."""
        p = self.p
        t1 = time.perf_counter()
        succ = self.heldin.score()
        point = {"iteration": p.iteration, "minutes": round(p.seconds / 60, 2), "transitions": p.budget["transitions"],
                 "success": int(sum(succ)), "episodes": len(succ), "weights": self.heldin.runner.weights_digest, "outcomes": succ}  # fmt: skip
        if p.held_in:
            base = p.held_in[0]["outcomes"]
            point["fixed"] = sum(a and not s for a, s in zip(succ, base))
            point["broken"] = sum(s and not a for a, s in zip(succ, base))
        if self.cfg.keep_best and (p.kept is None or point["success"] >= p.kept["success"]):
            point["kept"] = True
            p.kept = {k: v for k, v in point.items() if k != "outcomes"}
            self.kept_state = {k: v.detach().clone() for k, v in self.learner.model.state_dict().items()}
        p.held_in.append(point)
        p.budget["held_in_seconds"] += time.perf_counter() - t1
        start = p.held_in[0]
        tail = (
            f" (start {start['success']}: {point['fixed']} fixed / {point['broken']} broken)"
            if len(p.held_in) > 1
            else ""
        )
        self.say(f"held-in {point['minutes']:5.1f} min, iteration {p.iteration}: {point['success']}/{point['episodes']}"
                 f"{tail}{' <- kept' if point.get('kept') else ''}")  # fmt: skip

    def _result(self) -> dict:
        p = self.p
        budget = dict(p.budget, seconds=round(p.seconds, 1), minutes=round(p.seconds / 60, 2))
        budget["capture_count"] = {
            "graphs": self.graphs,
            "captures_during_training": capture_count() - self.captures0 - self.graphs,
        }
        kept_is_last = self.kept_state is None or p.kept["iteration"] == p.iteration
        last = None if kept_is_last else {k: v.detach().clone() for k, v in self.learner.model.state_dict().items()}
        if self.kept_state is not None:
            self.learner.model.load_state_dict(self.kept_state)
        return {"config": self.cfg.to_json(), "start": str(self.start), "budget": budget, "curve": p.curve,
                "held_in": p.held_in, "kept": p.kept, "recorded": p.recorded, "model": self.learner.model,
                "kept_is_last": kept_is_last, "last": last}  # fmt: skip


class _Holder:
    """A state dict standing in for a module or an optimiser (what :func:`save_state` reads of them)."""

    def __init__(self, sd):
        self.sd = sd

    def state_dict(self):
        return self.sd


def train(cfg: TrainConfig, out, policy=None, progress=print, resume: bool = False) -> dict:
    """Train ``cfg`` into ``out`` (see the module docstring); returns the result: the config, the budget (iterations,
    episodes, transitions, updates, seconds; the capture count), the learning curve, the held-in points, the kept
    point, ``model`` (the kept weights, or the last) and ``last`` (the last weights when another was kept, else None).
    Raises :class:`Interrupted` on Ctrl-C (state saved)."""
    return Trainer(cfg, out, policy, progress, resume).run()
