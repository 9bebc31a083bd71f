"""Where a chunk's time goes: ``torch.profiler`` over a few graph replays, kernels grouped into issue 42's categories.

On CUDA the device kernels of the replays (CUPTI sees a CUDA graph's kernels), each with its device time; on CPU the
ATen operations a replay dispatches, by their own (self) CPU time. Either way each kernel (or op) falls in one
category (:func:`category`): GEMM, attention, elementwise add, norm, add+norm (the lean sampler's fused
kernel), cast, GELU, copies, split-K reduce, CFG step, the whole expert step (one kernel), other. A kernel's name alone does not say whether a copy
is a cast, and a replay has no host ops to ask, so on CUDA one eager call is profiled first and each kernel name is
mapped through the ATen op that launched it (:func:`launching_ops`: under ``aten::_to_copy`` it is a cast, under
``aten::add`` an add); names that call did not launch fall back to the name rules. :func:`profile_replays` returns the per-replay totals,
the categories and the top kernels with their share of the kernel time; :func:`format_profile` prints them.

A replay's kernels do not say which part of the chunk launched them. :func:`phase_split` profiles one eager call
with the sampler's guided prefix (the encoder and the expert's prefix keys and values) marked, and splits the same
categories between that prefix and the expert's steps. The prefix of a ``3b`` chunk is compute-bound (hundreds of
rows through 2.5 B weights) and the steps are memory-bound (100 rows through 380 M weights, ten times), so a GEMM
figure alone does not say which one to work on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import torch

# Kineto, torch.profiler's engine, prints a "USDT:" line on stderr at every profiler start and stop (its top log level,
# above errors), which landed at the top of `rollcap bench`'s report. It reads this once, when a profiler first starts
# in the process; a level of the user's own is kept.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

CATEGORIES = (
    "GEMM",
    "attention",
    "elementwise add",
    "norm",
    "add+norm (fused)",
    "cast",
    "GELU",
    "copies",
    "split-K reduce",
    "CFG step",
    "expert step (fused)",
    "other",
)
"""The groups of the kernel table, in report order."""

_RULES: tuple[tuple[str, re.Pattern], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE))
    for cat, rx in (
        ("split-K reduce", r"splitk_?reduce|reduce_?splitk"),
        ("add+norm (fused)", r"_add_ln"),
        ("CFG step", r"_cfg_euler"),
        ("expert step (fused)", r"_expert_step"),
        ("attention", r"flash|fmha|attention|_expert_attn|sdpa|scaled_dot|cudnn_generated|mha"),
        ("GELU", r"gelu"),
        ("norm", r"layer_?norm|rms_?norm"),
        ("GEMM", r"gemm|nvjet|gemv|xmma|cutlass|aten::(addmm|mm|bmm|baddbmm|linear|matmul|_scaled_mm)\b|cublas"),
        ("cast", r"(copy|_to_copy|convert).*(bfloat16|bf16|half|float8|__nv_bfloat)|aten::_to_copy"),
        ("copies", r"copy|memcpy|memset|aten::(cat|stack|repeat|clone|contiguous)\b|cat_|catarray"),
        ("elementwise add", r"add|aten::add_?\b"),
    )
)


_BY_NAME = (
    "split-K reduce",
    "add+norm (fused)",
    "CFG step",
    "expert step (fused)",
    "attention",
    "GELU",
    "norm",
    "GEMM",
)
"""Categories a kernel's own name decides, whatever op launched it."""


def category(name: str, ops: tuple[str, ...] = ()) -> str:
    """The category of a kernel (or ATen op) ``name``, launched under ``ops`` (innermost first) when known."""
    for cat, rx in _RULES:
        if cat in _BY_NAME and rx.search(name):
            return cat
    if any(op in ("aten::_to_copy", "aten::to") for op in ops):
        return "cast"
    for text in (*ops, name):
        for cat, rx in _RULES:
            if rx.search(text):
                return cat
    return "other"


def _chain(e) -> tuple[str, ...]:
    out, p = [e.name], e.cpu_parent
    while p is not None:
        out.append(p.name)
        p = p.cpu_parent
    return tuple(out)


def launching_ops(call: Callable[[], None], device: torch.device) -> dict[str, tuple[str, ...]]:
    """Kernel name -> the ATen ops (innermost first) that launched it in one eager ``call`` on CUDA ({} if no profiler)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            _sync(device)
        events = prof.events()
    except RuntimeError:
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for e in events:
        kernels = getattr(e, "kernels", None) or []
        if not kernels:
            continue
        chain = _chain(e)
        for k in kernels:
            out.setdefault(k.name, chain)
    return out


def _profiler_error(err: RuntimeError) -> dict:
    """A profiler that cannot start (CUPTI missing or busy): the table is lost, not the sweep."""
    return {"error": f"profiler: {str(err).splitlines()[0] if str(err) else type(err).__name__}"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_replays(
    call: Callable[[], None],
    device: torch.device | str,
    replays: int = 3,
    top: int = 12,
    eager: Callable[[], None] | None = None,
) -> dict:
    """Profile ``replays`` calls of ``call`` (a graph replay) and group what ran; ``{"error": ...}`` if the profiler cannot start.

    ``eager``: the same function un-captured (CUDA: its kernels' launching ops decide casts and adds).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    cuda = device.type == "cuda"
    ops = launching_ops(eager, device) if cuda and eager is not None else {}
    call()
    _sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=acts) as prof:
            for _ in range(replays):
                call()
            _sync(device)
        events = prof.events()
    except RuntimeError as err:  # CUPTI missing or busy: the table is lost, not the sweep
        return _profiler_error(err)
    per: dict[str, list[float]] = {}  # name -> [count, us]
    for e in events:
        if cuda:
            if e.device_type != DeviceType.CUDA:
                continue
            us = e.time_range.elapsed_us()
        else:
            if e.device_type != DeviceType.CPU or not e.name.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
            if e.name not in ops:
                ops[e.name] = _chain(e)[1:]
        acc = per.setdefault(e.name, [0, 0.0])
        acc[0] += 1
        acc[1] += us
    total_us = sum(us for _, us in per.values()) or 1.0
    cats = {c: {"count": 0.0, "ms": 0.0} for c in CATEGORIES}
    rows = []
    for name, (count, us) in per.items():
        cat = category(name, ops.get(name, ()))
        cats[cat]["count"] += count / replays
        cats[cat]["ms"] += us / replays / 1e3
        rows.append(
            {
                "name": name[:160],
                "category": cat,
                "count": count / replays,
                "ms": us / replays / 1e3,
                "share": us / total_us,
            }
        )
    rows.sort(key=lambda r: -r["ms"])
    for c in cats.values():
        c["share"] = c["ms"] * 1e3 * replays / total_us
    return {
        "source": "CUDA kernels (device time)" if cuda else "ATen ops (self CPU time)",
        "replays": replays,
        "kernel_ms": total_us / replays / 1e3,
        "kernels": sum(c for c, _ in per.values()) / replays,
        "categories": {k: v for k, v in cats.items() if v["count"]},
        "top": rows[:top],
    }


PHASES = ("prefix", "steps", "other")
_MARKS = {"guided_prefix": "rollcap.phase.prefix", "step": "rollcap.phase.steps"}
"""The sampler regions marked (:meth:`~rollcap.policies.fused.FusedFlowVLA.guided_prefix` and ``step``) and their phase."""


def phase_split(call: Callable[[], None], model, device: torch.device | str) -> dict:
    """Kernel time (ms) of one eager ``call`` by phase and category: ``prefix`` is what the fused or lean sampler's
    ``guided_prefix`` region launched (the encoder, the expert's prefix keys and values), ``steps`` its ``step``
    region (the expert and the guided update, ten times), ``other`` the rest; ``unattributed_ms`` the device time the
    profiler tied to no host op. ``{"error": ...}`` if the profiler cannot start. ``model`` is left as it was (each
    mark is an instance attribute, removed after)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    device = torch.device(device)
    cuda = device.type == "cuda"

    def marked(inner, mark):
        def region(*args, **kwargs):
            with record_function(mark):
                return inner(*args, **kwargs)

        return region

    for name, mark in _MARKS.items():
        model.__dict__[name] = marked(getattr(model, name), mark)
    try:
        call()
        _sync(device)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            call()
            _sync(device)
        events = prof.events()
    except RuntimeError as err:
        return _profiler_error(err)
    finally:
        for name in _MARKS:
            model.__dict__.pop(name, None)
    out = {ph: {"ms": 0.0, "kernels": 0, "categories": {}} for ph in PHASES}
    device_ms = 0.0
    for e in events:
        if e.device_type == DeviceType.CUDA:
            device_ms += e.time_range.elapsed_us() / 1e3
            continue
        if e.device_type != DeviceType.CPU:
            continue
        if cuda:
            items = [(k.name, k.duration) for k in (getattr(e, "kernels", None) or [])]
        else:
            items = [(e.name, e.self_cpu_time_total)] if e.name.startswith("aten::") else []
        if not items:
            continue
        chain = _chain(e)
        ph = out[next((p for p, m in zip(PHASES, _MARKS.values()) if m in chain), "other")]
        for name, us in items:
            cat = category(name, chain)
            ph["ms"] += us / 1e3
            ph["kernels"] += 1
            ph["categories"][cat] = ph["categories"].get(cat, 0.0) + us / 1e3
    attributed = sum(out[ph]["ms"] for ph in PHASES)
    return {
        "source": "CUDA kernels of one eager call" if cuda else "ATen ops of one eager call (self CPU time)",
        **out,
        "unattributed_ms": max(device_ms - attributed, 0.0) if cuda else 0.0,
    }


def format_phases(p: dict, row, indent: str = "    ") -> None:
    """One line: each phase's kernel time and its two largest categories."""
    if "error" in p:
        row(f"{indent}phases", p["error"])
        return
    parts = []
    for ph in PHASES:
        top = sorted(p[ph]["categories"].items(), key=lambda kv: -kv[1])[:2]
        if p[ph]["kernels"]:
            parts.append(f"{ph} {p[ph]['ms']:.2f} ms (" + ", ".join(f"{k} {v:.2f}" for k, v in top) + ")")
    if p.get("unattributed_ms"):
        parts.append(f"unattributed {p['unattributed_ms']:.2f} ms")
    row(f"{indent}by phase ({p['source']})", "; ".join(parts))


def format_profile(p: dict, row, indent: str = "    ", top: int = 6) -> None:
    """One line of categories by share, then the ``top`` kernels."""
    if "error" in p:
        row(f"{indent}kernel profile", p["error"])
        return
    cats = sorted(p["categories"].items(), key=lambda kv: -kv[1]["ms"])
    row(
        f"{indent}kernel time {p['kernel_ms']:.2f} ms/chunk in {p['kernels']:.0f} {'kernels' if 'CUDA' in p['source'] else 'ops'}",
        " | ".join(f"{k} {v['share']:.0%} ({v['count']:.0f})" for k, v in cats),
    )
    for r in p["top"][:top]:
        row(f"{indent}  {r['share']:5.1%} {r['ms']:7.3f} ms x{r['count']:<4.0f} {r['category']:<16}", r["name"][:90])


def count_aten_ops(call) -> int:
    """ATen operations one call dispatches (views and all)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _Count.n += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        call()
    return _Count.n


def count_cuda_kernels(call, device: torch.device) -> int:
    """CUDA kernels (not memcpy/memset) the profiler records for one call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            _sync(device)
        return sum(
            1 for e in prof.events() if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        )
    except RuntimeError:  # a profiler that cannot start (CUPTI missing or busy) costs the count, not the sweep
        return None
