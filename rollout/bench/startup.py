"""``rollcap bench --only startup``: what starting costs, the command line's and an env worker's, beside torch's share.

Why: every env worker imported torch (1.8 s, 257 MB RSS each on the 2-core box;
3.6 GB at 14 workers) and ``rollcap --help`` took 2 s, though neither needs it
(issue 57). This times, in fresh interpreters: ``import rollcap``, ``rollcap
--help`` and ``rollcap run --help`` (through the console entry point's main);
a real env worker's spawn to ready and its peak RSS (:class:`EnvWorkers` over
a stand-in runner at batch 2, one worker, as a run starts them); and, side by
side in the same rounds, the same interpreters with ``import torch`` first:
what each of them paid before (the old path's lower bound: it also imported
rollcap's torch modules). Medians of interleaved rounds.

Imports point downward: ``build``, the batch bench's stand-in runners, the workers.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from rollcap.rollout.spec import Parts

_CLI = "from rollcap.rollout.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
_TORCH = "import torch\n"


_PEAK = """
import sys
try:
    with open("/proc/self/status") as f:  # VmHWM: ru_maxrss carries the parent's peak over a spawn
        mb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
except OSError:
    import resource
    mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
sys.stderr.write("\\nRSS %f" % mb)
"""


def _python(code: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of a fresh interpreter running ``code``."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code + _PEAK], capture_output=True, text=True, timeout=300, check=True)
    return time.perf_counter() - t0, float(out.stderr.rsplit("RSS ", 1)[1].split()[0])


def _worker_start(parts: Parts) -> dict:
    """One env worker started as a run starts it: its spawn-to-ready seconds, peak RSS and whether torch came in."""
    from rollcap.rollout.bench.batch import _runners
    from rollcap.rollout.build import make_env
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.workers import EnvWorkers

    env = make_env(parts.env_id, parts.env_kwargs)
    policy, critic = _runners(parts, 2, env, 1e-3)
    env.close()
    try:
        pool = EnvWorkers(parts.env_id, parts.env_kwargs, policy, critic, HostConfig(), workers=1)
        start = dict(pool.procs[0].start)
        pool.close()
    finally:
        policy.close()
        critic.close()
    return start


def bench_startup(parts: Parts, n: int) -> dict:
    """Start-up figures (see the module docstring); ``n`` < 100 (``--quick``): fewer rounds.

    Returns:
        JSON-able: ``cases``: per fresh-interpreter case (``import rollcap``, ``rollcap --help``, ``rollcap run
        --help``, ``worker modules + env``: what a worker imports and builds) the median ``s`` and ``rss_mb`` as shipped
        and with torch imported first (``torch_s``, ``torch_rss_mb``), the range of ``s``; ``worker``: a real env
        worker's spawn to ready (``start_s``), peak ``rss_mb`` and whether it held torch; ``rounds``.
    """
    rounds = 1 if n < 100 else 5
    env = f"make_env({parts.env_id!r}, {dict(parts.env_kwargs or {})!r})"
    cases = {
        "import rollcap": "import rollcap\n",
        "rollcap --help": _CLI.format(argv=["--help"]),
        "rollcap run --help": _CLI.format(argv=["run", "--help"]),
        "worker modules + env": "from rollcap.rollout.workers.child import Worker\n"
        "from rollcap.rollout.recording import EpisodeRecorder\n"
        f"from rollcap.rollout.build import make_env\n{env}\n",
    }
    got: dict[str, dict[str, list]] = {k: {"s": [], "rss_mb": [], "torch_s": [], "torch_rss_mb": []} for k in cases}
    workers: dict[str, list] = {"start_s": [], "rss_mb": [], "torch": []}
    for _ in range(rounds):  # interleaved: drift on a shared machine hits both alike
        for name, code in cases.items():
            for first, (ks, kr) in (("", ("s", "rss_mb")), (_TORCH, ("torch_s", "torch_rss_mb"))):
                wall, rss = _python(first + code)
                got[name][ks].append(wall)
                got[name][kr].append(rss)
        start = _worker_start(parts)
        for k in workers:
            workers[k].append(start[k])
    out = {name: {k: statistics.median(v) for k, v in d.items()} | {"min_s": min(d["s"]), "max_s": max(d["s"])} for name, d in got.items()}  # fmt: skip
    worker = {"start_s": statistics.median(workers["start_s"]), "min_s": min(workers["start_s"]),
              "max_s": max(workers["start_s"]), "rss_mb": statistics.median(workers["rss_mb"]), "held_torch": any(workers["torch"])}  # fmt: skip
    return {"rounds": rounds, "cases": out, "worker": worker}


def format_startup(r: dict, row) -> None:
    """Rows for the human table (``row(name, value)``)."""
    for name, c in r["cases"].items():
        row(
            f"  {name}",
            f"{c['s']:.2f} s ({c['min_s']:.2f}-{c['max_s']:.2f}), {c['rss_mb']:.0f} MB; "
            f"with torch imported first {c['torch_s']:.2f} s, {c['torch_rss_mb']:.0f} MB",
        )
    w = r["worker"]
    row(
        "  env worker, spawn to ready (EnvWorkers, 2 slots)",
        f"{w['start_s']:.2f} s ({w['min_s']:.2f}-{w['max_s']:.2f}), peak {w['rss_mb']:.0f} MB"
        + ("; it held torch (an env of yours imports it?)" if w["held_torch"] else "; no torch"),
    )
