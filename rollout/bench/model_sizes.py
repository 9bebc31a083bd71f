"""``rollcap bench --only models``, the size sweep: FlowVLA from the shipped size to pi0 scale, random weights.

For each named size (:mod:`rollcap.policies.sizes`), variant (``plain``; ``fused``, :mod:`rollcap.policies.fused`),
precision (``fp32``, ``tf32``, ``bf16``: :mod:`rollcap.kernels.precision`; in ``rollcap bench``, ``--precision``'s)
and graph backend (``jit`` on CPU, ``cuda`` on a GPU; ``--backend compile-cuda`` or ``compile`` when asked), one
batch-1 guided chunk of ``K`` Euler
steps is timed eager and as a graph replay over static buffers, side by side. Per cell:

- ``eager_ms`` / ``graph_ms``: median over ``reps`` chunks, eager and graph called alternately within a cell
  (CUDA: synchronised around each chunk); the eager row repeats the first backend's ``eager_ms``;
- ``kernels``: CUDA kernels of one chunk (``torch.profiler``; a replay where the profiler sees the graph's
  kernels, else one un-captured call), or on CPU the ATen operations one eager chunk dispatches;
- ``exact``: the replay's bytes equal its own eager reference at the same precision, else ``max_abs_diff``;
  ``same_bytes``: two replays of the same inputs agree;
- ``gflop`` a chunk; ``floor_ms``: the chunk's weight-traffic floor on a GPU this code knows (H100 SXM, H200), and
  ``over_floor``; ``roofline_ms`` there (bf16: :func:`~rollcap.policies.sizes.roofline_ms`);
- ``profile``: where the replay's time goes (:mod:`rollcap.rollout.bench.kernel_profile`: ``torch.profiler`` over three
  replays; CUDA kernels by device time, or on CPU ATen ops by self time, grouped into GEMM, attention, adds, norms,
  casts, GELU, copies, split-K reduce), printed as one line of shares and the top kernels.

Variants: ``plain``, ``fused``, and ``lean`` (:mod:`rollcap.policies.lean`: the fused sampler with its residual adds
in the norms and bias+GELU in the GEMM epilogue; on a GPU by default). The report's header names the sweep's
variants (``samplers``), precisions and backends.

The fused variant's ``max_abs_diff_vs_plain`` (fp32, eager) is stated once per size, and ``fused_over_plain``:
plain and fused chunks timed alternately (eager, and the first backend that is not compiled). ``python3 -m
rollcap.rollout.bench.model_sizes --help`` runs the sweep alone, writing JSON after every cell (so a run cut
short by a time limit keeps what it measured); the GPU check script uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rollcap.kernels.buffers import BufferSet, BufferSpec
from rollcap.kernels.errors import CaptureError
from rollcap.kernels.graph import CapturedGraph
from rollcap.policies.fused import fuse
from rollcap.policies.lean import lean
from rollcap.policies.observation import tokenize
from rollcap.policies.sizes import SIZES, SMALL, build, chunk_bounds, size_config
from rollcap.rollout.build import device_missing
from rollcap.rollout.bench.kernel_profile import count_aten_ops, count_cuda_kernels, format_profile, profile_replays

INSTRUCTION = "pick up the red cube and put it in the bowl"
VARIANTS = ("plain", "fused", "lean")
_HAS_PRECISION = "precision" in inspect.signature(CapturedGraph).parameters


@dataclasses.dataclass(frozen=True)
class SizeSweep:
    """What the sweep measures (an empty tuple: the device's default)."""

    sizes: tuple[str, ...] = ()
    """Size names or config files (default: the small sizes on CPU, every named size on a GPU)."""
    backends: tuple[str, ...] = ()
    """Graph backends beside eager (default: jit on CPU, cuda on a GPU; compile-cuda compiles each size and variant
    for tens of seconds, so it is measured when named)."""
    precisions: tuple[str, ...] = ()
    """Precisions (default: fp32 on CPU; fp32, tf32, bf16 on a GPU)."""
    variants: tuple[str, ...] = ()
    """Model variants (samplers): plain, fused, lean (default: plain and fused on CPU, where lean is fused's bytes; all three on a GPU)."""
    reps: int = 5
    """Timed chunks per cell (after 2 warm ones)."""
    profile: bool = True
    """Profile each graph cell's replays (the kernel table)."""

    def resolved(self, device: str, quick: bool = False) -> SizeSweep:
        cuda = torch.device(device).type == "cuda"
        sizes = self.sizes or (tuple(SIZES) if cuda else (SMALL[:1] if quick else SMALL))
        backends = self.backends or (("cuda",) if cuda else ("jit",))
        precisions = self.precisions or (("fp32", "tf32", "bf16") if cuda else ("fp32",))
        variants = self.variants or (("plain", "fused", "lean") if cuda else ("plain", "fused"))
        for name in sizes:
            size_config(name)  # a bad name or file fails here, before anything is built
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
        return dataclasses.replace(self, sizes=sizes, backends=backends, precisions=precisions, variants=variants)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(call, device: torch.device, reps: int) -> float:
    for _ in range(2):
        call()
    _sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def _time_pair(first, second, device: torch.device, reps: int) -> tuple[float, float]:
    """Median ms of ``first`` and of ``second``, called alternately so drift on a shared machine hits both alike."""
    a, b = [], []
    for fn in (first, second, first, second):
        fn()
    _sync(device)
    for _ in range(reps):
        for fn, acc in ((first, a), (second, b)):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            acc.append(time.perf_counter() - t0)
    return statistics.median(a) * 1e3, statistics.median(b) * 1e3


def _inputs(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {k: rng.integers(0, 256, (1, cfg.image_size, cfg.image_size, 3), dtype=np.uint8) for k in cfg.image_keys}
    values["state"] = rng.standard_normal((1, cfg.state_dim)).astype(np.float32)
    values["tokens"] = tokenize(INSTRUCTION[: cfg.max_tokens - 2], cfg.max_tokens)[None]
    values["noise"] = rng.standard_normal((1, cfg.horizon, cfg.action_dim)).astype(np.float32)
    return values


def _buffers(cfg, device) -> tuple[BufferSet, BufferSet]:
    ins = [BufferSpec(k, s, d) for k, (s, d) in cfg.obs_spec.buffer_shapes().items()]
    ins.append(BufferSpec("noise", (1, cfg.horizon, cfg.action_dim), torch.float32))
    return BufferSet(ins, device, label="sweep.in"), BufferSet(
        [BufferSpec("actions", (1, cfg.horizon, cfg.action_dim), torch.float32)], device, label="sweep.out"
    )


def deployed(model, precision: str, device: torch.device, fp8_scope: tuple[str, ...] | None = None):
    """``model`` as a runner at ``precision`` holds it (policies/observation.py): on CUDA at bf16 its linears stored in
    bf16, at fp8 the expert's at float8 (``fp8_scope``: other modules', for a measurement), a copy; else ``model``."""
    if precision in ("bf16", "fp8") and device.type == "cuda":
        from rollcap.kernels.fp8 import to_fp8
        from rollcap.kernels.precision import cast_linears

        model = cast_linears(model)
        if precision == "fp8":
            model = to_fp8(model, fp8_scope)
    return model


def _graph(model, ins: BufferSet, outs: BufferSet, backend: str, precision: str, cast: bool = True) -> CapturedGraph:
    """A graph of ``model.sample`` over the sweep's buffers (``cast``: of :func:`deployed` ``model``; False: as given)."""
    keys = model.cfg.image_keys
    if cast:
        model = deployed(model, precision, ins.device)

    def fn(b):
        return {"actions": model.sample([b[k] for k in keys], b["state"], b["tokens"], b["noise"])}

    kwargs = {"precision": precision} if _HAS_PRECISION else {}
    return CapturedGraph(fn, ins, outs, backend, [model], label=f"sweep.{backend}", **kwargs).prepare()


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def _cell(model, ins, outs, backend, precision, device, reps, eager: CapturedGraph, profile: bool = True) -> dict:
    cell: dict = {}
    eager.replay()
    ref = outs["actions"].clone()
    t0 = time.perf_counter()
    try:
        g = _graph(model, ins, outs, backend, precision)
    except (CaptureError, RuntimeError, ValueError) as err:
        return {"error": _one_line(err)}
    cell["capture_s"] = time.perf_counter() - t0
    cell["eager_ms"], cell["graph_ms"] = _time_pair(eager.replay, g.replay, device, reps)
    g.replay()
    a = outs["actions"].clone()
    g.replay()
    cell["same_bytes"] = bool(torch.equal(outs["actions"], a))
    cell["exact"] = bool(torch.equal(a, ref))
    cell["max_abs_diff"] = float((a - ref).abs().max())
    if profile:
        cell["profile"] = profile_replays(g.replay, device, 3, eager=eager.replay if "compile" not in backend else None)
    if device.type == "cuda":
        n = cell.get("profile", {}).get("kernels")
        n = round(n) if n is not None else count_cuda_kernels(g.replay, device)
        cell["kernels"], cell["kernels_from"] = n, "replay"
    cell.update(g.plan_facts)
    del g
    if "compile" in backend:  # the compiled regions hold frozen copies of the weights: let them go with the graph
        from torch import _dynamo

        model.release_compiled()
        _dynamo.reset()
    return cell


def _fused_over_plain(models: dict, ins, outs, sweep: SizeSweep, device: torch.device, pair=("plain", "fused")) -> dict:
    """Two variants' chunks (``pair``: plain and fused) timed alternately, eager and on the first backend that is not
    compiled (plain/fused: the first precision; fused/lean: the last, bf16 in a GPU's default sweep)."""
    res = {}
    precision = sweep.precisions[0] if pair[0] == "plain" else sweep.precisions[-1]
    for backend in ("eager", *[b for b in sweep.backends if "compile" not in b][:1]):
        try:
            plain, fused = (_graph(models[v], ins, outs, backend, precision) for v in pair)
        except (CaptureError, RuntimeError, ValueError):
            continue
        p_ms, f_ms = _time_pair(plain.replay, fused.replay, device, sweep.reps)
        res[backend] = {"precision": precision, "plain_ms": p_ms, "fused_ms": f_ms, "fused_over_plain": f_ms / p_ms}
        del plain, fused
    return res


def _compare_variants(models: dict, refs: dict, ins, outs, sweep: SizeSweep, device: torch.device, out: dict) -> None:
    """Fused against plain and lean against fused: their timed ratios and their chunks' largest difference, into
    ``out`` (``refs``: each (variant, precision)'s eager chunk)."""
    if "plain" in models and "fused" in models and (_HAS_PRECISION or sweep.precisions[0] == "fp32"):
        out["fused_over_plain"] = _fused_over_plain(models, ins, outs, sweep, device)
    if "fused" in models and "lean" in models:
        out["lean_over_fused"] = _fused_over_plain(models, ins, outs, sweep, device, ("fused", "lean"))
        for p in sweep.precisions:
            if ("fused", p) in refs and ("lean", p) in refs:
                out.setdefault("lean_max_abs_diff_vs_fused", {})[p] = float(
                    (refs["fused", p] - refs["lean", p]).abs().max()
                )
    if ("plain", "fp32") in refs and ("fused", "fp32") in refs:
        out["fused_max_abs_diff_vs_plain"] = float((refs["plain", "fp32"] - refs["fused", "fp32"]).abs().max())


def bench_size(name: str, sweep: SizeSweep, device: torch.device, emit=None) -> dict:
    """Every cell of one size; ``emit(partial)`` after each (for incremental JSON)."""
    cfg = size_config(name)
    plain = build(cfg, device)
    counts = {"params": sum(p.numel() for p in plain.parameters())}
    out: dict = {"config": cfg.to_json(), **counts, **chunk_bounds(cfg, device, sweep.precisions), "cells": []}
    models = {"plain": plain}
    if "fused" in sweep.variants:
        models["fused"] = fuse(plain)
    if "lean" in sweep.variants:
        models["lean"] = lean(plain)
    ins, outs = _buffers(cfg, device)
    ins.write({k: torch.from_numpy(v) for k, v in _inputs(cfg).items()})
    refs: dict = {}
    for variant in sweep.variants:
        model = models[variant]
        for precision in sweep.precisions:
            if not _HAS_PRECISION and precision != "fp32":
                out["cells"].append(
                    {
                        "variant": variant,
                        "precision": precision,
                        "error": "this checkout's CapturedGraph has no precision setting",
                    }
                )
                continue
            base = {"variant": variant, "precision": precision}
            try:
                eager = _graph(model, ins, outs, "eager", precision)
            except (CaptureError, RuntimeError, ValueError) as err:
                out["cells"].append({**base, "error": _one_line(err)})
                continue
            eager.replay()
            refs[(variant, precision)] = outs["actions"].clone()
            eager_kernels = (
                count_cuda_kernels(eager.replay, device) if device.type == "cuda" else count_aten_ops(eager.replay)
            )
            row = {
                **base,
                "backend": "eager",
                "kernels": eager_kernels,
                "kernels_from": "call" if device.type == "cuda" else "aten ops",
            }
            out["cells"].append(row)
            for backend in sweep.backends:
                cell = {
                    **base,
                    "backend": backend,
                    **_cell(model, ins, outs, backend, precision, device, sweep.reps, eager, sweep.profile),
                }
                if (
                    cell.get("kernels") is not None and cell["kernels"] <= 1
                ):  # the profiler saw the graph launch, not its kernels
                    cell["kernels"], cell["kernels_from"] = None, "not visible in a replay"
                if "graph_ms" in cell:
                    cell["speedup"] = cell["eager_ms"] / cell["graph_ms"]  # both timed alternately in this cell
                    if "floor_ms" in out:
                        cell["over_floor"] = cell["graph_ms"] / out["floor_ms"][precision]
                out["cells"].append(cell)
                row.setdefault("eager_ms", cell.get("eager_ms"))  # the first backend's alternately timed eager chunks
                if emit:
                    emit(out)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if row.get("eager_ms") is None:
                row["eager_ms"] = _time(eager.replay, device, sweep.reps)
            del eager
    _compare_variants(models, refs, ins, outs, sweep, device, out)
    del models, plain
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def bench_sizes(device: str, sweep: SizeSweep, emit=None) -> dict:
    """The sweep over ``sweep.sizes`` (resolved) on ``device``; one intra-op thread on CPU."""
    dev = torch.device(device)
    outer = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    report: dict = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "reps": sweep.reps,
        "samplers": list(sweep.variants),
        "precisions": list(sweep.precisions),
        "backends": ["eager", *sweep.backends],
        "sizes": {},
    }
    try:
        for name in sweep.sizes:
            try:
                report["sizes"][name] = bench_size(
                    name,
                    sweep,
                    dev,
                    (lambda part, name=name: emit({**report, "sizes": {**report["sizes"], name: part}}))
                    if emit
                    else None,
                )
            except (RuntimeError, ValueError) as err:  # out of memory for a size, say: the next size still runs
                report["sizes"][name] = {"error": _one_line(err), "cells": []}
                gc.collect()
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            if emit:
                emit(report)
    finally:
        torch.set_num_threads(outer)
    return report


def format_sizes(r: dict, row) -> None:
    """Rows: one per (size, variant, precision, backend)."""
    for name, s in r["sizes"].items():
        if "error" in s:
            row(name, s["error"])
            continue
        floor = s.get("floor_ms")
        row(
            f"{name} ({s['params'] / 1e6:.1f} M params, {s.get('gflop', float('nan')):,.1f} GFLOP a chunk)"
            + (f", floor {', '.join(f'{p} {v:.3f} ms' for p, v in floor.items())} on {s['gpu']}" if floor else "")
            + (f", bf16 roofline {s['roofline_ms']:.3f} ms" if "roofline_ms" in s else "")
        )
        for c in s["cells"]:
            label = f"  {c['variant']} {c['precision']} {c.get('backend', '')}"
            if "error" in c:
                row(label, c["error"])
                continue
            k = c.get("kernels")
            kern = f", {k} {'kernels' if c.get('kernels_from') != 'aten ops' else 'aten ops'}" if k is not None else ""
            if c["backend"] == "eager":
                row(label, f"{c['eager_ms']:.2f} ms{kern}")
                continue
            exact = "== eager" if c.get("exact") else f"max|diff| {c.get('max_abs_diff', float('nan')):.2g}"
            over = f", {c['over_floor']:.1f}x floor" if "over_floor" in c else ""
            row(label, f"{c['graph_ms']:.2f} ms ({c['speedup']:.1f}x eager{over}){kern}, {exact}")
            if "profile" in c:
                format_profile(c["profile"], row)
        for backend, x in s.get("fused_over_plain", {}).items():
            row(
                f"  fused / plain, {backend} {x['precision']} (alternating)",
                f"{x['fused_ms']:.2f} / {x['plain_ms']:.2f} ms = {x['fused_over_plain']:.2f}",
            )
        for backend, x in s.get("lean_over_fused", {}).items():
            row(
                f"  lean / fused, {backend} {x['precision']} (alternating)",
                f"{x['fused_ms']:.2f} / {x['plain_ms']:.2f} ms = {x['fused_over_plain']:.2f}",
            )
        if "fused_max_abs_diff_vs_plain" in s:
            row("  fused vs plain (fp32 eager)", f"max|diff| {s['fused_max_abs_diff_vs_plain']:.2g}")
        for p, d in s.get("lean_max_abs_diff_vs_fused", {}).items():
            row(f"  lean vs fused ({p} eager)", f"max|diff| {d:.2g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m rollcap.rollout.bench.model_sizes", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--sizes", default="", help=f"comma list of {', '.join(SIZES)} or config .json files (default: the device's)"
    )
    ap.add_argument(
        "--backends",
        default="",
        help="comma list of graph backends beside eager (default: jit on CPU; cuda on GPU; add compile-cuda to measure it)",
    )
    ap.add_argument(
        "--precisions", default="", help="comma list of fp32,tf32,bf16,fp8 (default: fp32 on CPU; all on GPU)"
    )
    ap.add_argument(
        "--variants", default="", help="comma list of plain,fused,lean (default: plain,fused on CPU; all on a GPU)"
    )
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel profile of each graph cell")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the report here (after every cell)")
    args = ap.parse_args(argv)

    def split(s: str) -> tuple[str, ...]:
        return tuple(x for x in s.split(",") if x)

    missing = device_missing(args.device)
    if missing is not None:
        print(f"error: --device: {missing}", file=sys.stderr)
        return 2
    try:
        sweep = SizeSweep(
            split(args.sizes),
            split(args.backends),
            split(args.precisions),
            split(args.variants),
            args.reps,
            not args.no_profile,
        ).resolved(args.device)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    def emit(report: dict) -> None:
        if args.json:
            tmp = args.json.with_suffix(".tmp")
            tmp.write_text(json.dumps(report, indent=1))
            tmp.replace(args.json)

    report = bench_sizes(args.device, sweep, emit)
    emit(report)
    lines: list[str] = []
    format_sizes(report, lambda name, val=None: lines.append(f"  {name}" if val is None else f"  {name:<44} {val}"))
    print(f"FlowVLA sizes on {report['device']} (torch {report['torch']}):\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
