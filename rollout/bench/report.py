"""``rollcap bench``: side-by-side figures from one run (ratios, not absolutes).

Sections: ``models`` (policy eager vs captured, critic, policy || critic vs
serial, capture time, exactness; then the FlowVLA sizes up to pi0 scale, plain
and fused, per backend and precision, against the weight-traffic floor:
:mod:`rollcap.rollout.bench.model_sizes`, sizes chosen with ``--policy-size``),
``capsule`` (snapshot/restore per tier vs a plain copy, restore vs rebuild-and-recapture), ``env`` (steps/s), ``host``
(overhead per chunk, recording overhead, capsule reset vs env.reset + runner
re-creation), ``branch`` (:mod:`rollcap.rollout.bench.branch`), ``scaling``
(capsule restore/snapshot vs copy from 25 KB to 256 MB,
:mod:`rollcap.capsule.bench_scaling`), ``peer`` (the loop users write today,
:mod:`rollcap.rollout.bench.peer`), ``recording`` (the writer's stages,
:mod:`rollcap.rollout.bench.recording`), ``startup`` (``import rollcap``, ``--help``, an env worker's start
and RSS, beside torch's share: :mod:`rollcap.rollout.bench.startup`). Each section's seconds are in
``section_s``. Opt-in (``--only``): ``backends`` (the CPU plans jit, aoti and
compile side by side, :mod:`rollcap.rollout.bench.backends`), ``batch`` (envs 1 / 8 / ... in this process
and on env workers, the shipped policy and a fixed-latency stand-in, recorded; the host's per-slot work; the batched
vector env vs ``AsyncVectorEnv(2)``, :mod:`rollcap.rollout.bench.batch`).
"""

from __future__ import annotations

import importlib
import os
import platform
import time

import torch

from rollcap.rollout.bench.timing import load_note, load_now
from rollcap.rollout.spec import Parts

SECTIONS = ("models", "capsule", "env", "host", "gym", "branch", "scaling", "peer", "recording", "startup")
OPT_IN = ("backends", "batch")
"""Sections run only when named in ``--only`` (``backends`` compiles for minutes on a cold cache; ``batch`` records runs for a few minutes)."""
_MODULE = {"scaling": "capsule"}
"""The module of a section whose name is not its module's: ``bench_<section>`` lives in ``rollcap.rollout.bench.<module>``."""


CHECKPOINTS = ("models", "capsule", "scaling", "peer", "backends")
"""Sections that measure a policy checkpoint's and a critic's graphs (captured and eager) and capsules (not a named policy, not --critic none)."""
IN_ENV = ("host", "gym", "branch", "peer", "recording")
"""Sections that run the policy in ``--env``."""


def check_parts(parts: Parts, only: tuple[str, ...]) -> None:
    """Refuse, before any section runs, parts a chosen section cannot measure (ConfigError naming the option).

    A named policy (``expert``, ``lerobot:DIR``) or no critic has no captured graph for :data:`CHECKPOINTS`;
    another ``--env`` must be one the policy reads (checked as ``rollcap run`` checks it) for :data:`IN_ENV`.
    """
    from rollcap.rollout.spec import DEFAULT_ENV, named_policy
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.errors import ConfigError

    need = [s for s in only if s in CHECKPOINTS]
    others = ",".join(s for s in SECTIONS if s not in CHECKPOINTS)
    if need and named_policy(parts.policy) is not None:
        raise ConfigError(
            "policy",
            f"{parts.policy}: section(s) {','.join(need)} measure a checkpoint's captured graph; pick others with --only ({others})",
        )
    if need and parts.critic is None:
        raise ConfigError(
            "critic", f"none: section(s) {','.join(need)} measure the critic too; pick others with --only ({others})"
        )
    if any(s in IN_ENV for s in only) and (parts.env_id != DEFAULT_ENV or parts.env_kwargs):
        env = make_env(parts.env_id, parts.env_kwargs)
        try:
            for runner in make_runners(parts, env):
                if runner is not None:
                    runner.close()
        finally:
            env.close()


def run_bench(
    parts: Parts,
    quick: bool = False,
    only: tuple[str, ...] | None = None,
    sizes: tuple[str, ...] = (),
    batch: dict | None = None,
) -> dict:
    """Run the chosen sections (default: all) and return a JSON-able report (:func:`check_parts` first).

    ``sizes``: the FlowVLA sizes the ``models`` section sweeps (names or config files; empty: the device's default).
    """
    only = only or SECTIONS
    bad = [s for s in only if s not in SECTIONS + OPT_IN]
    if bad:
        raise ValueError(f"--only: unknown section(s) {bad}; choose from {','.join(SECTIONS + OPT_IN)}")
    check_parts(parts, only)
    extra: dict = {"batch": batch or {}}  # section batch: envs, workers, standin (rollcap bench --batch-*)
    if "models" in only:
        from rollcap.rollout.bench.model_sizes import SizeSweep

        backends = (
            (parts.backend,) if parts.backend not in (None, "eager") else ()
        )  # --backend: the sweep's graph backend
        sweep = SizeSweep(sizes=tuple(sizes), backends=backends, precisions=(parts.precision,))
        extra["models"] = {
            "sweep": sweep.resolved(parts.device, quick)
        }  # a bad size fails here, before any section runs
    n = 20 if quick else 200
    report: dict = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "device": parts.device,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads_per_lane": parts.threads,
        },
        "repeats": n,
    }
    fns = {
        s: getattr(importlib.import_module(f"rollcap.rollout.bench.{_MODULE.get(s, s)}"), f"bench_{s}") for s in only
    }
    report["section_s"], report["load"] = {}, {}
    start = time.perf_counter()
    for s in only:
        before, t0 = load_now(), time.perf_counter()
        report[s] = fns[s](parts, n, **extra.get(s, {}))
        report["section_s"][s] = time.perf_counter() - t0
        after = load_now()  # the busier of the two: a wall-clock figure of a section is as noisy as its worst minute
        report["load"][s] = {"load": max(before["load"], after["load"]), "cpus": after["cpus"]}
    report["wall_s"] = time.perf_counter() - start
    return report


_FORMAT = {
    "models": ("models", "models (backend {backend}):"),
    "capsule": ("capsule", "capsule (policy + critic state, {bytes} bytes):"),
    "env": ("env", "env:"),
    "host": ("host", "host:"),
    "gym": ("gym", "gym (ChunkEnv / NoiseSteeringEnv):"),
    "scaling": ("capsule", "capsule scaling (restore / snapshot vs a plain copy; ratio median, IQR over rounds):"),
    "peer": ("peer", "peer (the same env and policy driven as LeRobot / openpi loops do):"),
    "recording": ("recording", "recording (the writer's stages per episode, real episodes of the policy in the env):"),
    "startup": (
        "startup",
        "startup (fresh interpreters, {rounds} interleaved rounds; beside each, torch imported first):",
    ),
    "backends": ("backends", "CPU plans side by side (jit, aoti, compile; interleaved rounds):"),
    "batch": ("batch", "batch (envs {envs} on one policy graph, in this process and in env workers; recorded runs):"),
    "branch": ("branch", "branch (restore + continuation vs the prefix from scratch):"),
    "section_s": None,
}
"""Section -> (its module under ``rollcap.rollout.bench``, its title; fields of the section's report fill the title), in report order."""


def format_report(r: dict) -> str:
    """The human table: a title per section, then its rows (each section's ``format_<name>(report, row)``)."""
    m = r["machine"]
    lines = [
        f"machine: {m['platform']}, {m['cpus']} cpus, torch {m['torch']}, {m['device']} ({m['cpu_capability']}), {m['threads_per_lane']} thread(s)/lane"
    ]

    def row(name, val=None):
        lines.append(f"  {name}" if val is None else f"  {name:<44} {val}")

    for name, spec in _FORMAT.items():
        if name not in r:
            continue
        if spec is None:
            lines.append(_seconds_line(r))
            continue
        module, title = spec
        load = r.get("load", {}).get(name)
        note = load_note(load)  # every wall-clock figure of a section that ran on a busy machine is noisy
        lines.append(title.format(**r[name]) + (f" [{note.removeprefix('; ')}]" if note else ""))
        section = {**r[name], "load": load}  # its figures say how busy the machine was
        getattr(importlib.import_module(f"rollcap.rollout.bench.{module}"), f"format_{name}")(section, row)
    return "\n".join(lines)


def _seconds_line(r: dict) -> str:
    """The sections' seconds, the whole run's wall and the load they ran under (last: every section has run)."""
    line = "seconds per section: " + ", ".join(f"{k} {v:.1f}" for k, v in r["section_s"].items())
    loads = [x["load"] for x in r.get("load", {}).values()]
    if "wall_s" in r:
        line += f"; {r['wall_s']:.0f} s in all"
    if loads:
        cpus = next(iter(r["load"].values()))["cpus"]
        line += f" at a 1-minute load of {min(loads):.1f} to {max(loads):.1f} on {cpus} cpus"
        line += " (busy: wall-clock figures marked noisy)" if max(loads) > cpus / 2 else ""
    return line
