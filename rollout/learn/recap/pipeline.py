"""One RECAP iteration end to end, and its manifest: what ``rollcap recap`` does.

:func:`recap` runs the five stages (collect, value, advantage, improve,
evaluate; each a function of its own module) and writes into ``out``:

- ``policy.json`` / ``policy.safetensors``: the improved policy, its chosen
  guidance weight in its config (a new ``weights_digest``, so a new
  fingerprint: every episode recorded with it names it);
- ``critic.json`` / ``critic.safetensors``: the refit critic;
- ``recap.json``: the manifest (input runs with their digests, the critic
  used, thresholds, percentile, seeds, steps, guidance weight, every stage's
  statistics and the evaluation).

The files are written into a staging directory beside ``out`` that becomes
``out`` in one rename once the manifest is written: an interrupted or failed
iteration leaves nothing behind, a finished one is whole.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from rollcap.kernels.files import canonical_json, plain_json, write_report
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.learn.recap.config import RecapConfig

MANIFEST = "recap.json"


def _digest_of(seeds: list[int]) -> str:
    return "sha256:" + hashlib.sha256(np.asarray(seeds, np.int64).tobytes()).hexdigest()


def _seed_block(seeds: list[int], stream: int, seed: int) -> dict:
    return {
        "rule": f"evaluate.stream_seeds({seed}, {stream}, n)",
        "n": len(seeds),
        "first": seeds[:3],
        "digest": _digest_of(seeds),
    }


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError("out", f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError("out", f"{out}: directory is not empty (choose another for this iteration)")


def recap(runs, out, cfg: RecapConfig | None = None, log=print) -> dict:  # noqa: PLR0915 - one iteration read top to bottom: collect, value, advantage, improve, evaluate, each timed
    """Run one RECAP iteration on the run directories ``runs``; write the checkpoints and manifest to ``out``.

    Returns the manifest (also ``out/recap.json``).

    Raises:
        ConfigError: ``out`` not empty, a bad config field.
        ValueError / CorruptEpisode / FileNotFoundError: an unusable input run (naming it).
    """
    from rollcap.critics import DEFAULT_CHECKPOINT as CRITIC, load_critic, save_critic
    from rollcap.policies import DEFAULT_CHECKPOINT as POLICY, load_policy, save_policy
    from rollcap.rollout.learn.recap import advantage, collect, evaluate, improve, value

    cfg = cfg or RecapConfig()
    out = Path(out)
    _check_out(out)
    runs = [runs] if isinstance(runs, (str, os.PathLike)) else list(runs)
    if not runs:
        raise ConfigError("runs", "give at least one run directory to learn from")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    stage = None

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        times[name] = round(now - since, 1)
        return now

    try:
        policy_path, critic_path = Path(cfg.policy or POLICY), Path(cfg.critic or CRITIC)
        shipped, critic0 = load_policy(policy_path), load_critic(critic_path)
        if max(cfg.execute_steps) > shipped.cfg.horizon:  # found now, not after the fine-tune
            raise ConfigError(
                "execute_steps", f"the policy's chunks hold {shipped.cfg.horizon} actions, got {max(cfg.execute_steps)}"
            )
        tic = time.perf_counter()
        got = collect.collect(runs, demos=cfg.demos, seed=cfg.seed, policy_cfg=shipped.cfg, log=log)
        steps = got.rollouts
        if len(steps) == 0:
            raise ValueError(
                f"{', '.join(map(str, runs))}: no executed steps to learn from (every episode stopped at its first boundary)"
            )
        env = _envs_of(steps)  # validation and evaluation run in every env the runs were recorded in
        val_seeds = evaluate.stream_seeds(cfg.seed, evaluate.VALIDATION, cfg.val_episodes)
        test_seeds = evaluate.stream_seeds(cfg.seed, evaluate.TEST, cfg.eval_episodes)
        used = collect.collected_seeds(steps) | got.shown.seeds
        evaluate.check_disjoint(val_seeds, used, "validation")
        evaluate.check_disjoint(test_seeds, used, "held-out")
        evaluate.check_disjoint(test_seeds, set(val_seeds), "held-out")
        tic = lap("collect", tic)

        critic = copy.deepcopy(critic0)
        v_final0 = value.final_values(critic0, steps)
        targets = value.value_targets(steps, v_final0)
        hold = value.holdout_mask(steps)
        before_q = value.critic_quality(_values_on(critic0, steps, hold), targets, steps, hold)
        critic_losses = value.refit_critic(
            critic,
            steps,
            targets,
            got.demos,
            n_steps=cfg.critic_steps,
            batch=cfg.batch,
            lr=cfg.critic_lr,
            seed=cfg.seed + 21,
            log=log,
        )
        values = value.predict(critic, steps.images, steps.state, steps.tokens)
        after_q = value.critic_quality(values, targets, steps, hold)
        calib = value.branch_calibration({"shipped": critic0, "refit": critic}, steps)
        log(
            f"value: held-out episodes: MAE {before_q['mae']:.3f} -> {after_q['mae']:.3f}, mid-episode AUROC {before_q['auroc_mid']:.3f} -> {after_q['auroc_mid']:.3f}"
        )
        tic = lap("value", tic)

        v_final = value.final_values(critic, steps)
        adv = advantage.advantages(steps, values, v_final, targets, cfg.n_step)
        labels, adv_stats = advantage.binarise(steps, adv, cfg.percentile)
        log(f"advantage: {adv_stats['positive_fraction']:.0%} positive ({adv_stats['positive_fraction_in_successes']:.0%} of success steps, "
            f"{adv_stats['positive_fraction_in_failures']:.0%} of failure steps), thresholds {[round(t['threshold'], 4) for t in adv_stats['tasks'].values()]}")  # fmt: skip
        tic = lap("advantage", tic)

        policy = copy.deepcopy(shipped)
        policy_losses = improve.fine_tune(
            policy,
            steps,
            labels,
            got.demos,
            n_steps=cfg.policy_steps,
            batch=cfg.batch,
            lr=cfg.policy_lr,
            seed=cfg.seed + 22,
            windows=cfg.windows,
            log=log,
        )
        tic = lap("improve_fit", tic)
        beta, beta_report = improve.choose_beta(
            policy, cfg.betas, val_seeds, max(cfg.execute_steps), env, cfg.threads, log
        )
        stage = _staging(out)
        save_policy(improve.with_beta(policy, beta), stage / "policy")
        save_critic(critic, stage / "critic")
        policy_json, critic_json = out / "policy.json", out / "critic.json"  # their names once the iteration is whole
        tic = lap("improve_beta", tic)

        after = load_policy(stage / "policy.json")  # exactly what was written
        results = evaluate.evaluate(shipped, after, test_seeds, cfg.execute_steps, env, cfg.threads, log)
        lap("evaluate", tic)
        times["total"] = round(time.perf_counter() - t0, 1)
        manifest = {
            "rollcap_recap": 1,
            "config": plain_json({k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()}),
            "inputs": {"runs": got.runs, "demonstrations": {"episodes": cfg.demos, "steps": 0 if got.demos is None else len(got.demos.value), "rule": got.shown.rule}},
            "policy": {"from": str(policy_path), "from_digest": _weights_digest(policy_path),
                       "to": str(policy_json), "to_digest": _weights_digest(stage / "policy.json"), "cfg_beta": beta},
            "critic": {"from": str(critic_path), "from_digest": _weights_digest(critic_path),
                       "to": str(critic_json), "to_digest": _weights_digest(stage / "critic.json")},
            "collect": {"episodes": len(steps.episodes), "steps": len(steps), "successes": sum(r["success"] for r in steps.episodes),
                        "censored": sum(r["censored"] for r in steps.episodes), "human_steps": int(steps.human.sum()),
                        "stop_reasons": _count(r["stop_reason"] for r in steps.episodes)},
            "value": {"critic_steps": cfg.critic_steps, "held_out_episodes_every": value.HOLDOUT_EVERY, "shipped": before_q, "refit": after_q,
                      "branch_calibration": calib, "loss_first_last": _ends(critic_losses)},
            "advantage": {"n_step": cfg.n_step, "percentile": cfg.percentile, **adv_stats},
            "improve": {"policy_steps": cfg.policy_steps, "windows": cfg.windows, "label_steps": int((steps.boundary if cfg.windows == "boundaries" else steps.label_ok).sum()), "loss_first_last": _ends(policy_losses),
                        "beta": beta, "validation": {**beta_report, "seeds": _seed_block(val_seeds, evaluate.VALIDATION, cfg.seed)}},
            "evaluate": {"env": {"id": env[0][0], "kwargs": env[0][1]}, "envs": [{"id": e, "kwargs": kw} for e, kw in env], "seeds": _seed_block(test_seeds, evaluate.TEST, cfg.seed), "results": results},
            "seconds": times,
            "torch": torch.__version__,
        }  # fmt: skip
        write_report(stage / MANIFEST, manifest)
        if out.is_dir():
            out.rmdir()  # empty (checked at the start)
        os.replace(stage, out)  # the whole iteration appears at once
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(threads_before)
    log(f"recap: wrote {out / MANIFEST} ({times['total']:.0f} s)")
    return manifest


def _envs_of(steps) -> list[tuple[str, dict]]:
    """The distinct ``(env id, kwargs)`` of the collected episodes, in the order first seen."""
    seen: dict[str, tuple[str, dict]] = {}
    for r in steps.episodes:
        seen.setdefault(canonical_json([r["task"], r["env_kwargs"]]), (r["task"], r["env_kwargs"]))
    return list(seen.values())


def _staging(out: Path) -> Path:
    """A fresh directory beside ``out`` the checkpoints are written into; renamed to ``out`` when the manifest is written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    return stage


def _weights_digest(path) -> str:
    """The ``weights_digest`` of a checkpoint's JSON (its weights were checked against it when loaded)."""
    import json

    return json.loads(Path(path).with_suffix(".json").read_text(encoding="utf-8"))["weights_digest"]


def _values_on(critic, steps, mask):
    from rollcap.rollout.learn.recap.value import predict

    v = np.zeros(len(steps), np.float32)
    v[mask] = predict(critic, steps.images[mask], steps.state[mask], steps.tokens[mask])
    return v


def _count(items) -> dict:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _ends(losses: list[float], k: int = 20) -> list[float]:
    return [float(np.mean(losses[:k])), float(np.mean(losses[-k:]))] if losses else []
