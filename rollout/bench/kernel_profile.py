"""Where a chunk's time goes: ``torch.profiler`` over a few graph replays, kernels grouped into issue 42's categories.

On CUDA the device kernels of the replays (CUPTI sees a CUDA graph's kernels), each with its device time; on CPU the
ATen operations a replay dispatches, by their own (self) CPU time. Either way each kernel (or op) falls in one
category (:func:`category`): GEMM, attention, elementwise add, norm, add+norm (the lean sampler's fused
kernel), cast, GELU, copies, split-K reduce, CFG step, other. A kernel's name alone does not say whether a copy
is a cast, and a replay has no host ops to ask, so on CUDA one eager call is profiled first and each kernel name is
mapped through the ATen op that launched it (:func:`launching_ops`: under ``aten::_to_copy`` it is a cast, under
``aten::add`` an add); names that call did not launch fall back to the name rules. :func:`profile_replays` returns the per-replay totals,
the categories and the top kernels with their share of the kernel time; :func:`format_profile` prints them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

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
    "other",
)
"""The groups of the kernel table, in report order."""

_RULES: tuple[tuple[str, re.Pattern], ...] = tuple(
    (cat, re.compile(rx, re.IGNORECASE))
    for cat, rx in (
        ("split-K reduce", r"splitk_?reduce|reduce_?splitk"),
        ("add+norm (fused)", r"_add_ln"),
        ("CFG step", r"_cfg_euler"),
        ("attention", r"flash|fmha|attention|sdpa|scaled_dot|cudnn_generated|mha"),
        ("GELU", r"gelu"),
        ("norm", r"layer_?norm|rms_?norm"),
        ("GEMM", r"gemm|nvjet|gemv|xmma|cutlass|aten::(addmm|mm|bmm|baddbmm|linear|matmul|_scaled_mm)\b|cublas"),
        ("cast", r"(copy|_to_copy|convert).*(bfloat16|bf16|half|float8|__nv_bfloat)|aten::_to_copy"),
        ("copies", r"copy|memcpy|memset|aten::(cat|stack|repeat|clone|contiguous)\b|cat_|catarray"),
        ("elementwise add", r"add|aten::add_?\b"),
    )
)


_BY_NAME = ("split-K reduce", "add+norm (fused)", "CFG step", "attention", "GELU", "norm", "GEMM")
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
        chain, p = [], e
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        for k in kernels:
            out.setdefault(k.name, tuple(chain))
    return out


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
        return {"error": f"profiler: {str(err).splitlines()[0] if str(err) else type(err).__name__}"}
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
                chain, q = [], e.cpu_parent
                while q is not None:
                    chain.append(q.name)
                    q = q.cpu_parent
                ops[e.name] = tuple(chain)
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
