"""Find the first op whose bits differ between two machines, for one recorded chunk.

On each machine, trace the recorded observation and noise of one chunk through the shipped models' eager forward::

    python3 -m rollcap.rollout.offline.opdiff trace RUN --episode 0 --chunk 0 --out ops-intel.json
    python3 -m rollcap.rollout.offline.opdiff compare ops-intel.json ops-amd.json

``compare`` names the first op whose inputs are equal on both and whose outputs are not: the op whose kernel follows
the machine (:mod:`rollcap.kernels.opdiff`). The same two commands on one machine under two settings (say
``MKL_ENABLE_INSTRUCTIONS=AVX2`` and unset) show what a setting changes. The trace covers the policy, then the critic
when the recording has one; both run eagerly, the reference the captured plans are checked equal to.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def trace_chunk(run: str | Path, episode: int = 0, chunk: int = 0) -> dict:
    """``{"fingerprint", "episode", "chunk", "policy": [ops], "critic": [ops]}`` for one recorded chunk."""
    import torch

    from rollcap.kernels.opdiff import trace_ops
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_runners
    from rollcap.rollout.protocols import observation_at
    from rollcap.rollout.recording.runs import iter_episodes

    rec = next((r for _, r in iter_episodes(run) if not isinstance(r, Exception) and r.index == episode), None)
    if rec is None:
        raise SystemExit(f"opdiff: {run}: no readable episode {episode}")
    if not 0 <= chunk < rec.num_chunks:
        raise SystemExit(f"opdiff: --chunk {chunk}: episode {episode} has {rec.num_chunks} chunk(s)")
    policy, critic = make_runners(Parts(env_id=rec.env_id))
    try:
        obs = observation_at(rec, int(rec.chunks["chunk_start"][chunk]))
        values = {k: torch.from_numpy(v) for k, v in policy._inputs(obs, rec.chunks["noise"][chunk]).items()}
        out = {
            "fingerprint": policy.state_fingerprint(),
            "episode": episode,
            "chunk": chunk,
            "policy": trace_ops(policy.eager, values),
        }
        if critic is not None and "critic" in rec.fingerprints:
            cvalues = {k: torch.from_numpy(v) for k, v in critic.obs_inputs(obs).items()}
            out["critic"] = trace_ops(critic.eager, cvalues)
        return out
    finally:
        policy.close()
        if critic is not None:
            critic.close()


def compare(a: dict, b: dict) -> list[str]:
    """One line per model: the first op that differs, or that none does."""
    from rollcap.kernels.opdiff import first_difference

    lines = []
    for model in ("policy", "critic"):
        if model not in a or model not in b:
            continue
        d = first_difference(a[model], b[model])
        lines.append(
            f"{model}: no op differs ({len(a[model])} ops)"
            if d is None
            else f"{model}: op {d['index']} of {d['ops']} ({d['op']}) differs first: {d['why']}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m rollcap.rollout.offline.opdiff", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="digest every op of one recorded chunk's forward on this machine")
    t.add_argument("run", help="a run directory or recording file")
    t.add_argument("--episode", type=int, default=0)
    t.add_argument("--chunk", type=int, default=0)
    t.add_argument("--out", required=True, help="the trace's JSON file")
    c = sub.add_parser("compare", help="the first op whose inputs agree and outputs differ between two traces")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args(argv)
    if args.cmd == "trace":
        Path(args.out).write_text(json.dumps(trace_chunk(args.run, args.episode, args.chunk)) + "\n")
        return 0
    traces = []
    for path in (args.a, args.b):
        try:
            traces.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as err:
            raise SystemExit(f"opdiff: {path}: not a trace ({err})") from None
    lines = compare(*traces)
    print("\n".join(lines))
    return 0 if all("no op differs" in ln for ln in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
