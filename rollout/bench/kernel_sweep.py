"""Issue 42's side-by-side: today's batch-1 chunk against the new settings, in one process, timed alternately.

``python3 -m rollcap.rollout.bench.kernel_sweep --device cuda --json OUT.json`` builds each named size once (random
weights) and captures one graph per setting over the same static buffers:

- ``fused-bf16``: today's path (round 4: the fused sampler, bf16 weights, rollcap's CUDA graph);
- ``lean-bf16``: the lean sampler (:mod:`rollcap.policies.lean`: residual adds fused into the norms, bias+GELU in the
  GEMM epilogue, no cast kernels), bf16;
- ``lean-fp8``: the lean sampler at ``--precision fp8`` (the expert's GEMMs in float8; sm89+ only, else an error entry);
- ``lean-fp8-prefix``: a measurement, not a setting a user can pick: the encoder's block GEMMs in float8 too (at
  ``3b`` the 1,092-token prefix is compute-bound: float8 tensor cores do twice the bf16 rate), with its max |diff|
  (measured once, 1.00x today at ``3b``: not in the default settings since);
- ``compile-bf16`` (``--compile``): the fused sampler through ``compile-cuda`` (inductor's kernels in rollcap's graph);
- ``lean-bf16-shared``: ``lean-bf16`` of the same size and weights with ``shared_prefix`` (the guidance branches share
  the observation's prefix: :attr:`~rollcap.policies.flow_vla.FlowVLAConfig.shared_prefix`). Another model: its
  max |diff| against today is that of a different network, not a rounding;
- ``lean-bf16-attn``, ``lean-bf16-shared-attn``: a measurement, not a runner setting yet: those two with the expert's
  attention in one Triton kernel a call (:mod:`rollcap.kernels.attention`: no key/value copy, 16-query programs)
  instead of a copy and SDPA; on CPU the reference runs (the same chunk as without);
- ``lean-bf16-step``: a measurement, not a runner setting yet: ``lean-bf16`` with a small expert's whole Euler step in
  one Triton kernel (:mod:`rollcap.kernels.expert_step`); where the expert is too wide for it (every size but
  ``shipped``) the setting is reported as not taken, with the reason, and costs no time.

Per size and setting: the chunk's median and range over ``reps`` rounds (every setting replayed once per round, in
turn, so drift hits all alike), ``exact`` (the replay equals its own eager chunk byte for byte; compile-cuda states
its max |diff| instead), ``max_abs_diff_vs_today`` (against ``fused-bf16``'s chunk), the kernel count and, for the
sizes in ``--profile`` (default ``3b,205m,shipped``), the kernel table (:mod:`rollcap.rollout.bench.kernel_profile`). On a CPU
(a dry run) the graph backend is ``jit`` and ``lean-fp8`` is refused. JSON is written after every size.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from rollcap.kernels.expert_step import config_fits
from rollcap.kernels.graph import default_backend
from rollcap.kernels.precision import check_precision
from rollcap.policies.fused import fuse
from rollcap.policies.lean import lean
from rollcap.policies.sizes import build, chunk_bounds, size_config
from rollcap.rollout.bench.kernel_profile import (
    CATEGORIES,
    PHASES,
    format_phases,
    format_profile,
    phase_split,
    profile_replays,
)
from rollcap.rollout.bench.model_sizes import _buffers, _graph, _inputs, _one_line, deployed
from rollcap.rollout.build import device_missing

SETTINGS = {
    "fused-bf16": ("fused", "bf16", None),
    "lean-bf16": ("lean", "bf16", None),
    "lean-fp8": ("lean", "fp8", None),
    "lean-fp8-prefix": ("lean", "fp8", None),
    "compile-bf16": ("fused", "bf16", "compile-cuda"),
    "lean-bf16-shared": ("lean", "bf16", None),
    "lean-bf16-attn": ("lean-attn", "bf16", None),
    "lean-bf16-shared-attn": ("lean-attn", "bf16", None),
    "lean-bf16-step": ("lean-step", "bf16", None),
}
"""Setting -> (sampler, precision, graph backend; None: the device's default)."""
SAMPLERS = {
    "fused": fuse,
    "lean": lean,
    "lean-attn": partial(lean, attention_kernel=True),
    "lean-step": partial(lean, step_kernel=True),
}
"""A setting's sampler name -> how it is built from the plain model."""
SHARED = ("lean-bf16-shared", "lean-bf16-shared-attn")
"""Settings whose model is the size with ``shared_prefix`` (same weights)."""
FP8_SCOPES = {"lean-fp8-prefix": ("encoder.blocks", "expert.blocks")}
"""Settings whose float8 linears are not the ``fp8`` precision's (``FP8_SCOPE``)."""
OWN_MODEL = (*FP8_SCOPES, *SHARED)
"""Settings that hold a model of their own (the others with the same sampler and precision share one)."""
TODAY = "fused-bf16"
BETWEEN_GEMMS = ("elementwise add", "norm", "cast", "copies", "GELU")
"""The categories issue 42 counts as traffic between GEMMs (its goal: at most 10% of the chunk)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _held_models(cfg, settings: tuple[str, ...], device: torch.device, out: dict) -> tuple[dict, dict]:
    """Each setting's model as its runner would hold it (``out`` gets the sizes' GFLOP, rooflines and parameter
    count); returns ``(held, errors)``: setting -> model, setting -> why it was not built."""
    # Each setting's model as its runner would hold it, made once (the eager reference and the graph share it), and
    # the fp32 masters dropped before anything is captured: at 3b each copy is 6-12 GB.
    held: dict[str, object] = {}
    errors: dict[str, str] = {}
    for shared in sorted({s in SHARED for s in settings}):
        cfg_s = dataclasses.replace(cfg, shared_prefix=True) if shared else cfg
        key, bounds = "shared" if shared else "today", chunk_bounds(cfg_s, device, ("bf16", "fp8"))
        out["gflop"][key] = bounds.pop("gflop")
        if "roofline_ms" in bounds:  # a GPU this code knows; its weight floors are the same with or without sharing
            out.setdefault("roofline_ms", {})[key] = bounds.pop("roofline_ms")
            out.update(bounds)
        plain = build(cfg_s, device)  # the same seed: the same weights
        out["params"] = sum(p.numel() for p in plain.parameters())
        for sampler in sorted({SETTINGS[s][0] for s in settings if (s in SHARED) == shared}):
            if sampler == "lean-step" and config_fits(cfg_s) is not None:  # refused before a copy is built
                errors.update({s: f"not taken: {config_fits(cfg_s)}" for s in settings if SETTINGS[s][0] == sampler})
                continue
            master = SAMPLERS[sampler](plain)
            for s in settings:
                _, precision, backend = SETTINGS[s]
                if SETTINGS[s][0] != sampler or (s in SHARED) != shared:
                    continue
                twin = next((k for k in held if SETTINGS[k][:2] == SETTINGS[s][:2] and k not in OWN_MODEL), None)
                if twin is not None and s not in OWN_MODEL:  # compile-bf16 holds fused-bf16's model
                    held[s] = held[twin]
                    continue
                try:
                    check_precision(precision, device)
                    if (backend or "") == "compile-cuda" and device.type != "cuda":
                        raise ValueError("compile-cuda captures a CUDA graph: GPU only")
                    held[s] = deployed(master, precision, device, FP8_SCOPES.get(s))
                except Exception as err:
                    errors[s] = _one_line(err)
            del master
            _free(device)
        del plain
        _free(device)
    return held, errors


def _time_replays(graphs: dict, device: torch.device, reps: int, out: dict) -> None:
    """``reps`` timed replays of each captured setting (after two warm ones): its median, min and max chunk ms, and
    the ratios to the weight floor and to today's setting, into ``out``."""
    times: dict[str, list[float]] = {s: [] for s in graphs}
    for _ in range(2):
        for g, _e in graphs.values():
            g.replay()
    _sync(device)
    for _ in range(reps):
        for s, (g, _e) in graphs.items():
            t0 = time.perf_counter()
            g.replay()
            _sync(device)
            times[s].append((time.perf_counter() - t0) * 1e3)
    for s, ts in times.items():
        row = out["settings"][s]
        row.update(chunk_ms=statistics.median(ts), chunk_ms_min=min(ts), chunk_ms_max=max(ts))
        if "floor_ms" in out:
            row["over_floor"] = row["chunk_ms"] / out["floor_ms"]["fp8" if row["precision"] == "fp8" else "bf16"]
    if TODAY in times:
        for s in times:
            out["settings"][s]["over_today"] = out["settings"][s]["chunk_ms"] / out["settings"][TODAY]["chunk_ms"]


def _profile_graphs(graphs: dict, held: dict, device: torch.device, out: dict) -> None:
    """Each setting's replays profiled into ``out``: its kernels, the share between GEMMs, the eager call's phases."""
    for s, (g, eager) in graphs.items():
        p = profile_replays(g.replay, device, 3, eager=None if "compile" in s else eager.replay)
        out["settings"][s]["profile"] = p
        if "compile" not in s:  # the eager call's kernels, split between the prefix and the expert's steps
            out["settings"][s]["phases"] = phase_split(eager.replay, held[s], device)
        if "categories" in p:
            out["settings"][s]["between_gemms_share"] = sum(
                p["categories"].get(c, {}).get("share", 0.0) for c in BETWEEN_GEMMS
            )
            out["settings"][s]["kernels"] = round(p["kernels"])


def sweep_size(name: str, settings: tuple[str, ...], device: torch.device, reps: int, profile: bool) -> dict:
    """Every setting of one size (see the module docstring)."""
    cfg = size_config(name)
    out: dict = {"settings": {}, "gflop": {}}
    held, errors = _held_models(cfg, settings, device, out)
    ins, outs = _buffers(cfg, device)
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    graphs, chunks = {}, {}
    for s in settings:
        sampler, precision, backend = SETTINGS[s]
        backend = backend or default_backend(device)
        row: dict = {"sampler": sampler, "precision": precision, "backend": backend}
        out["settings"][s] = row
        try:
            if s in errors or s not in held:
                raise ValueError(errors.get(s, "not built"))
            model = held[s]
            eager = _graph(model, ins, outs, "eager", precision, cast=False)
            eager.replay()
            ref = outs["actions"].clone()
            t0 = time.perf_counter()
            g = _graph(model, ins, outs, backend, precision, cast=False)
            row["capture_s"] = time.perf_counter() - t0
            g.replay()
            a = outs["actions"].clone()
            g.replay()
            row["same_bytes"] = bool(torch.equal(outs["actions"], a))
            row["exact"] = bool(torch.equal(a, ref))
            row["max_abs_diff_vs_eager"] = float((a - ref).abs().max())
        except Exception as err:  # one setting failing (no fp8, out of memory, a compiler error) costs it alone
            row["error"] = errors.get(s) or _one_line(err)
            _free(device)
            continue
        graphs[s], chunks[s] = (g, eager), a
    if TODAY in chunks:
        for s, a in chunks.items():
            out["settings"][s]["max_abs_diff_vs_today"] = float((a - chunks[TODAY]).abs().max())
    _time_replays(graphs, device, reps, out)
    if profile:
        _profile_graphs(graphs, held, device, out)
    del graphs, held
    if any("compile" in s for s in settings):  # the compiled regions hold frozen weight copies
        from torch import _dynamo  # imported here: only a compile setting loads dynamo

        _dynamo.reset()
    _free(device)
    return out


def format_sweep(r: dict, row) -> None:
    for name, s in r["sizes"].items():
        if "error" in s:
            row(name, s["error"])
            continue
        floor = s.get("floor_ms")
        gflop = ", ".join(f"{k} {v:,.0f}" for k, v in s.get("gflop", {}).items())
        roof = ", ".join(f"{k} {v:.2f}" for k, v in s.get("roofline_ms", {}).items())
        row(
            f"{name} ({s['params'] / 1e6:.0f} M params, GFLOP a chunk: {gflop})"
            + (f", weight floor bf16 {floor['bf16']:.2f} ms, fp8 {floor['fp8']:.2f} ms on {s['gpu']}" if floor else "")
            + (f", bf16 roofline ms: {roof}" if roof else "")
        )
        for k, c in s["settings"].items():
            if "error" in c:
                row(f"  {k}", c["error"])
                continue
            if "chunk_ms" not in c:
                continue
            exact = (
                "== eager"
                if c.get("exact")
                else f"max|diff| vs eager {c.get('max_abs_diff_vs_eager', float('nan')):.2g}"
            )
            vs = f", {c['over_today']:.2f}x today" if "over_today" in c else ""
            diff = (
                f", max|diff| vs today {c['max_abs_diff_vs_today']:.2g}" + (" (another model)" if k in SHARED else "")
                if k != TODAY and "max_abs_diff_vs_today" in c
                else ""
            )
            between = f", between GEMMs {c['between_gemms_share']:.0%}" if "between_gemms_share" in c else ""
            row(
                f"  {k}",
                f"{c['chunk_ms']:.2f} ms ({c['chunk_ms_min']:.2f}-{c['chunk_ms_max']:.2f}){vs}, {exact}{diff}{between}",
            )
            if "profile" in c:
                format_profile(c["profile"], row, indent="    ", top=5)
            if "phases" in c:
                format_phases(c["phases"], row)


def kernel_table(r: dict, sizes: tuple[str, ...]) -> str:
    """Markdown: per profiled size, each category's share and ms per chunk, side by side across the settings."""
    lines = []
    for name in sizes:
        s = r["sizes"].get(name, {})
        cols = [k for k, c in s.get("settings", {}).items() if "categories" in c.get("profile", {})]
        if not cols:
            continue
        lines += [f"\n{name} ({r['device']}), kernel time per chunk by category (ms, share):\n"]
        lines.append("| category | " + " | ".join(cols) + " |")
        lines.append("| --- |" + " --- |" * len(cols))
        for cat in (*CATEGORIES, "total"):
            cells = []
            for k in cols:
                p = s["settings"][k]["profile"]
                if cat == "total":
                    cells.append(f"**{p['kernel_ms']:.2f}** ({p['kernels']:.0f} kernels)")
                else:
                    c = p["categories"].get(cat)
                    cells.append(f"{c['ms']:.2f} ({c['share']:.0%}, {c['count']:.0f})" if c else "-")
            if any(x != "-" for x in cells):
                lines.append(f"| {cat} | " + " | ".join(cells) + " |")
        lines += phase_table(s, cols)
    return "\n".join(lines) + "\n"


def phase_table(s: dict, cols: list[str]) -> list[str]:
    """Markdown rows: each phase's kernel time (one eager call) and its categories, across ``cols``."""
    cols = [k for k in cols if "prefix" in s["settings"][k].get("phases", {})]
    if not cols:
        return []
    src = s["settings"][cols[0]]["phases"]["source"]
    lines = [
        f"\nby phase ({src}; ms):\n",
        "| phase: category | " + " | ".join(cols) + " |",
        "| --- |" + " --- |" * len(cols),
    ]
    for ph in PHASES:
        got = [s["settings"][k]["phases"][ph] for k in cols]
        if not any(g["kernels"] for g in got):
            continue
        lines.append(f"| **{ph}** | " + " | ".join(f"**{g['ms']:.2f}** ({g['kernels']})" for g in got) + " |")
        for cat in CATEGORIES:
            if any(cat in g["categories"] for g in got):
                cells = (f"{g['categories'][cat]:.2f}" if cat in g["categories"] else "-" for g in got)
                lines.append(f"| {ph}: {cat} | " + " | ".join(cells) + " |")
    un = [s["settings"][k]["phases"].get("unattributed_ms", 0.0) for k in cols]
    if any(un):
        lines.append("| unattributed | " + " | ".join(f"{u:.2f}" for u in un) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m rollcap.rollout.bench.kernel_sweep", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="", help="comma list (default: 3b,205m,26m,shipped on a GPU; shipped on CPU)")
    ap.add_argument(
        "--settings",
        default="fused-bf16,lean-bf16,lean-fp8,lean-bf16-shared,lean-bf16-attn,lean-bf16-shared-attn,lean-bf16-step",
        help=f"comma list of {', '.join(SETTINGS)}",
    )
    ap.add_argument(
        "--compile", action="store_true", help="add compile-bf16 (inductor compiles each size: tens of seconds)"
    )
    ap.add_argument(
        "--profile",
        default="3b,205m,shipped",
        help="sizes whose kernel table is taken (default 3b,205m,shipped: shipped for the step kernel's launches)",
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None, help="write the report here (after every size)")
    ap.add_argument("--table", type=Path, default=None, help="write the kernel tables (markdown) here")
    args = ap.parse_args(argv)
    missing = device_missing(args.device)
    if missing is not None:
        print(f"error: --device: {missing}", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    sizes = tuple(x for x in args.sizes.split(",") if x) or (
        ("3b", "205m", "26m", "shipped") if dev.type == "cuda" else ("shipped",)
    )
    settings = tuple(x for x in args.settings.split(",") if x) + (("compile-bf16",) if args.compile else ())
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        print(f"error: --settings: unknown {', '.join(bad)}; choose from {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    profiled = tuple(x for x in args.profile.split(",") if x)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    report = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "reps": args.reps,
        "settings": list(settings),
        "sizes": {},
    }

    def emit() -> None:
        if args.json:
            tmp = args.json.with_suffix(".tmp")
            tmp.write_text(json.dumps(report, indent=1))
            tmp.replace(args.json)

    for name in sizes:
        t0 = time.perf_counter()
        try:
            report["sizes"][name] = sweep_size(name, settings, dev, args.reps, name in profiled or dev.type == "cpu")
        except Exception as err:  # out of memory for a size, say: the next size still runs
            report["sizes"][name] = {"error": _one_line(err)}
            _free(dev)
        report["sizes"][name]["seconds"] = time.perf_counter() - t0
        emit()
    lines: list[str] = []
    format_sweep(report, lambda n, v=None: lines.append(f"  {n}" if v is None else f"  {n:<16} {v}"))
    print(f"batch-1 chunk, side by side ({report['device']}, torch {report['torch']}, {args.reps} alternating rounds):")
    print("\n".join(lines))
    table = kernel_table(report, profiled if dev.type == "cuda" else sizes)
    if args.table:
        args.table.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
