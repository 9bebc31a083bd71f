#!/usr/bin/env bash
# The GPU check in one command, for a machine with one NVIDIA GPU and a CUDA torch but none of rollcap's other
# needs (the GPU check machine: Python 3.12, torch 2.11+cu130; see ../shared/GPU.md):
#
#   bash scripts/gpu_check.sh [OUT_DIR]          # OUT_DIR defaults to $OUT, else gpu_check/
#
# 1. installs what is missing from wheels carried with the tree in .whl/ (mujoco, mujoco-core, gymnasium,
#    farama-notifications, glfw, PyOpenGL; make them with the `pip download` line in BENCHMARKS.md), then rollcap
#    itself (editable, no build isolation, no network);
# 2. the `cuda`-marked tests, then the exactness core (kernels, policies, critics, capsules, replay defaults,
#    golden) with the GPU visible, on that machine's torch;
# 3. two `rollcap run --device cuda --seed 7` processes per precision (fp32, bf16), compared episode by episode
#    by digest, and `rollcap replay` of each with no flags (device, backend, precision come from the recording);
# 4. `rollcap bench --device cuda`, every section but models (host, recording, peer, capsule, branch, ...);
# 5. the models sweep (issue 33): the named sizes, plain and fused, eager vs CUDA graph, fp32 / tf32 / bf16;
# 6. the batched core at batch 32 vs 1 (`rollcap bench --only batch`, issue 34), and a recorded --envs 32 run replayed
#    (with Ray installed: --actors 2 --envs 16 too);
# 6c. env workers (issue 41): `--only batch` with envs 1/32/64 in process and on 14 env workers, and a recorded
#    --envs 32 run in process vs on the workers, digests compared (workers_digests.json); alone: STEPS=workers;
# 7. opt-in (STEPS=compile): compile-cuda beside the plain CUDA graph, fused, bf16.
# 9. opt-in (STEPS=issue57; about 9 minutes on one H100, 16 cores; one call): issue 57's GPU figures: the workers
#    table at --envs 32/64/128 on 14 env workers with the GPU's busy fraction and the model's prediction beside it
#    (bench_i57_workers.json: its "model" holds both), the host overhead at batch 1 (bench_i57_host.json), start-up
#    and the writer's CPU per episode and format on that box (bench_i57_startup_writer.json), and the kernel table of
#    the samplers never timed on a GPU (shared guidance prefix, expert attention kernel, whole-step kernel) at 3b, 205m,
#    26m and shipped (kernels_i57.json, kernel_table_i57.md). GPU_CHECK_DEVICE=cpu runs it shortened (its dry run).
# 8. opt-in (STEPS=kernels, issue 42; about 4 minutes on one H100): the batch-1 chunk side by side in one process
#    (today's fused bf16 CUDA graph vs the lean sampler at bf16 and fp8, with the shared prefix, with the expert's
#    attention kernel; KERNEL_COMPILE=1 adds compile-cuda at 3b) at
#    3b, 205m, 26m, shipped, with the kernel tables of 3b and 205m (kernels.json, kernel_table.md); the cuda tests of
#    the new kernels; `rollcap bench --only host` (host overhead at batch 1, bench_host.json); two `rollcap run
#    --sampler lean` processes at bf16 and at fp8, compared by digest. A short table is printed last.
#
# Each step has its own time limit, a failed step does not stop the others, and everything lands in OUT_DIR:
# log.txt (all output), summary.json (each step's exit code and seconds, the digest comparisons, the machine),
# bench_core.json, bench_batch.json, pytest_cuda.txt, pytest_core.txt, sizes.json, compile_cuda.json (each as its step
# ends, so a cut run keeps what finished).
# SECTIONS narrows step 4's bench sections. STEPS=tests,core,runs,bench,models,batch,envs,workers,compile,kernels,issue57 picks steps (default: all but compile and kernels; SIZES, PRECISIONS and
# COMPILE_SIZES narrow the sweeps); GPU_CHECK_DEVICE=cpu runs the same steps on the CPU, shortened, to check the script.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu_check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d)
DEV=${GPU_CHECK_DEVICE:-cuda}
STEPS=${STEPS:-tests,core,runs,bench,models,envs,workers}  # batch: superseded by workers (the same section, more envs)
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1
PY=python3
ROLLCAP=("$PY" -m rollcap.rollout.cli)
if [ "$DEV" = cpu ]; then EPISODES=3; QUICK=(--quick); else EPISODES=20; QUICK=(); fi

step() {  # step NAME LIMIT_S CMD...: run, time, and note the exit code in steps.jsonl
  local name=$1 limit=$2 t0 rc
  shift 2
  echo "== $name ($(date -u +%T)): $*"
  t0=$EPOCHREALTIME
  timeout "$limit" "$@"
  rc=$?
  printf '{"step": "%s", "rc": %d, "seconds": %s}\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')" >>"$WORK/steps.jsonl"
  echo "== $name: exit $rc"
  return 0
}
want() { [[ ",$STEPS," == *",$1,"* ]]; }

# ---------------------------------------------------------------- 1. install
if ! "$PY" -c "import mujoco, gymnasium" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  step install-wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import rollcap.rollout" 2>/dev/null || step install-rollcap 120 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
nvidia-smi -L 2>/dev/null
"$PY" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count(), 'python', sys.version.split()[0])"

# ---------------------------------------------------------------- 2. tests
if want tests; then
  step pytest-cuda 150 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests >"$OUT_DIR/pytest_cuda.txt" 2>&1
  tail -n 15 "$OUT_DIR/pytest_cuda.txt"
fi
if want core; then
  # The exactness core on this machine's torch (the oldest the pin admits, 2.11, on the GPU check machine).
  step pytest-core 150 "$PY" -m pytest -q -p no:cacheprovider -n 8 -m "not slow" tests/kernels tests/policies tests/critics tests/capsule \
    tests/rollout/test_golden.py tests/rollout/offline/test_deployment.py tests/envs/test_push_block.py >"$OUT_DIR/pytest_core.txt" 2>&1
  tail -n 25 "$OUT_DIR/pytest_core.txt"
fi

# ---------------------------------------------------------------- 3. runs, digests, replay
if want runs; then
  for p in fp32 bf16; do
    for r in a b; do
      step "run-$p-$r" 60 "${ROLLCAP[@]}" run --device "$DEV" --precision "$p" --seed 7 --episodes "$EPISODES" --no-progress --out "$WORK/run-$p-$r"
    done
  done
  step replay-fp32 90 "${ROLLCAP[@]}" replay "$WORK/run-fp32-a"      # no flags: cuda, backend and precision from the recording
  step replay-bf16 60 "${ROLLCAP[@]}" replay "$WORK/run-bf16-a" --mode policy
fi

# ---------------------------------------------------------------- 4. bench
if want bench; then  # every section but the models sweep (step 5) and the opt-in ones
  step bench-core 150 "${ROLLCAP[@]}" bench --device "$DEV" --only ${SECTIONS:-capsule,env,host,gym,branch,scaling,peer,recording} "${QUICK[@]}" \
    --json "$OUT_DIR/bench_core.json"
fi

# ---------------------------------------------------------------- 5. model sizes (issue 33)
if want models; then  # the named sizes, plain and fused, eager vs the CUDA graph, each precision; JSON after every cell
  if [ "$DEV" = cpu ]; then SIZES=shipped PRECISIONS=fp32,bf16; else SIZES=${SIZES:-shipped,26m,205m,3b} PRECISIONS=${PRECISIONS:-fp32,tf32,bf16}; fi
  step models 150 "$PY" -m rollcap.rollout.bench.model_sizes --device "$DEV" --sizes "$SIZES" --precisions "$PRECISIONS" --reps 3 \
    --variants plain,fused --no-profile --json "$OUT_DIR/sizes.json"   # as in round 4; the lean sampler and the kernel tables: STEPS=kernels
fi

# ---------------------------------------------------------------- 6. batched core (issue 34)
if want batch; then
  step bench-batch 120 "${ROLLCAP[@]}" bench --device "$DEV" --only batch "${QUICK[@]}" --json "$OUT_DIR/bench_batch.json"
fi

# ---------------------------------------------------------------- 6b. a batched run, recorded and replayed (issue 34)
if want envs; then
  N=$([ "$DEV" = cpu ] && echo 4 || echo 32)
  step "run-envs-$N" 120 "${ROLLCAP[@]}" run --device "$DEV" --envs "$N" --episodes $((2 * N)) --seed 7 --no-progress --out "$WORK/run-envs"
  step "replay-envs-$N" 120 "${ROLLCAP[@]}" replay "$WORK/run-envs"   # no flags: device and batch from the recording
  if "$PY" -c "import ray" 2>/dev/null; then  # Ray actors with N envs each, all on the one GPU (skipped where Ray is not installed)
    step "run-actors-2-envs-$((N / 2))" 180 "${ROLLCAP[@]}" run --device "$DEV" --actors 2 --envs $((N / 2)) --episodes $((2 * N)) --seed 7 --no-progress --out "$WORK/run-actors"
    step "replay-actors" 120 "${ROLLCAP[@]}" replay "$WORK/run-actors"
  fi
fi

# ---------------------------------------------------------------- 6c. env workers (issue 41): envs in worker processes
# `rollcap bench --only batch` with envs 1, 32, 64 (WORKER_ENVS) in this process and on WORKERS env workers (default 14 of
# 16 cores), both formats recorded, the shipped policy on CUDA graphs -> bench_workers.json; then a recorded --envs 32
# run in process and one on the workers, compared digest by digest (the same bytes wherever the envs lived).
if want workers; then
  if [ "$DEV" = cpu ]; then WENVS=1,4; WW=2; N=4; else WENVS=${WORKER_ENVS:-1,32,64}; WW=${WORKERS:-14}; N=32; fi
  step bench-workers 200 "${ROLLCAP[@]}" bench --device "$DEV" --only batch "${QUICK[@]}" --batch-envs "$WENVS" \
    --batch-workers "$WW" --batch-standin 0 --json "$OUT_DIR/bench_workers.json"
  step "run-envs-$N-inproc" 60 "${ROLLCAP[@]}" run --device "$DEV" --envs "$N" --episodes $((2 * N)) --seed 7 --no-progress --out "$WORK/run-w0"
  step "run-envs-$N-workers-$WW" 60 "${ROLLCAP[@]}" run --device "$DEV" --envs "$N" --env-workers "$WW" --episodes $((2 * N)) --seed 7 --no-progress --out "$WORK/run-w1"
  step "run-envs-$N-graphs-2-workers-$WW" 60 "${ROLLCAP[@]}" run --device "$DEV" --envs "$N" --graphs 2 --env-workers "$WW" --episodes $((2 * N)) --seed 7 --no-progress --out "$WORK/run-w2"
  step workers-digests 60 "$PY" -c "
import json, os, sys
from rollcap.rollout.recording import episode_digest, load_any
a, b = ([episode_digest(r) for r in load_any(d)] for d in sys.argv[1:3])
s = {'episodes': [len(a), len(b)], 'identical': sum(x == y for x, y in zip(a, b))}
for d, k in ((sys.argv[1], 'inproc'), (sys.argv[2], 'workers'), (sys.argv[4], 'graphs_2_workers')):
    f = d + '/summary.json'
    s[k] = {x: json.load(open(f)).get(x) for x in ('wall_s', 'episodes', 'boundary_ms_median', 'policy_ms_median', 'host_timing', 'worker_timing')} if os.path.exists(f) else None
print(json.dumps(s, indent=1)); open(sys.argv[3], 'w').write(json.dumps(s, indent=1))
sys.exit(0 if s['identical'] == len(a) == len(b) else 1)" "$WORK/run-w0" "$WORK/run-w1" "$OUT_DIR/workers_digests.json" "$WORK/run-w2"
fi

# ---------------------------------------------------------------- 7. compile-cuda (opt-in: inductor compiles each size, cold cache)
if want compile; then
  if [ "$DEV" = cpu ]; then SIZES=shipped BACKENDS=jit; else SIZES=${COMPILE_SIZES:-26m,205m,3b} BACKENDS=cuda,compile-cuda; fi
  step compile-cuda 300 "$PY" -m rollcap.rollout.bench.model_sizes --device "$DEV" --sizes "$SIZES" --variants fused \
    --backends "$BACKENDS" --precisions bf16 --reps 5 --json "$OUT_DIR/compile_cuda.json"
fi

# ---------------------------------------------------------------- 8. kernels (issue 42, opt-in)
if want kernels; then
  if [ "$DEV" = cpu ]; then KSIZES=shipped KREPS=3 KEPS=2; else KSIZES=${KERNEL_SIZES:-3b,205m,26m,shipped} KREPS=20 KEPS=5; fi
  step kernel-sweep 330 "$PY" -m rollcap.rollout.bench.kernel_sweep --device "$DEV" --sizes "$KSIZES" --reps "$KREPS" \
    --json "$OUT_DIR/kernels.json" --table "$OUT_DIR/kernel_table.md"
  step pytest-kernels 60 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_fused_ops.py tests/kernels/test_fp8.py \
    tests/kernels/test_staging.py tests/kernels/test_expert_attention.py tests/kernels/test_expert_step.py tests/policies/test_lean.py tests/policies/test_shared_prefix.py \
    >"$OUT_DIR/pytest_kernels.txt" 2>&1
  tail -n 5 "$OUT_DIR/pytest_kernels.txt"
  step bench-host 75 "${ROLLCAP[@]}" bench --device "$DEV" --only host "${QUICK[@]}" --json "$OUT_DIR/bench_host.json"
  for p in bf16 fp8; do
    for r in a b; do
      step "run-lean-$p-$r" 45 "${ROLLCAP[@]}" run --device "$DEV" --sampler lean --precision "$p" --seed 7 --episodes "$KEPS" --no-progress --out "$WORK/run-lean-$p-$r"
    done
  done
  if [ -n "${KERNEL_COMPILE:-}" ] && [ "$DEV" = cuda ]; then  # inductor compiles 3b's two regions: a minute or more
    step kernel-compile 120 "$PY" -m rollcap.rollout.bench.kernel_sweep --device "$DEV" --sizes 3b --settings fused-bf16 --compile \
      --reps 10 --profile 3b --json "$OUT_DIR/kernels_compile.json" --table "$OUT_DIR/kernel_table_compile.md"
  fi
fi

# ---------------------------------------------------------------- 9. issue 57 (opt-in: STEPS=issue57)
if want issue57; then
  if [ "$DEV" = cpu ]; then IENVS=4; IW=2; ISIZES=shipped; IREPS=2; else IENVS=${I57_ENVS:-32,64,128}; IW=${WORKERS:-14}; ISIZES=${I57_SIZES:-3b,205m,26m,shipped}; IREPS=10; fi
  step i57-workers 270 "${ROLLCAP[@]}" bench --device "$DEV" --only batch --quick --batch-envs "$IENVS" --batch-workers "$IW" \
    --batch-standin 0 --json "$OUT_DIR/bench_i57_workers.json"
  step i57-host 75 "${ROLLCAP[@]}" bench --device "$DEV" --only host "${QUICK[@]}" --json "$OUT_DIR/bench_i57_host.json"
  step i57-startup-writer 90 "${ROLLCAP[@]}" bench --device "$DEV" --only startup,recording --quick --json "$OUT_DIR/bench_i57_startup_writer.json"
  step i57-kernels 150 "$PY" -m rollcap.rollout.bench.kernel_sweep --device "$DEV" --sizes "$ISIZES" --reps "$IREPS" \
    --settings fused-bf16,lean-bf16,lean-bf16-shared,lean-bf16-attn,lean-bf16-shared-attn,lean-bf16-step --profile "$ISIZES" \
    --json "$OUT_DIR/kernels_i57.json" --table "$OUT_DIR/kernel_table_i57.md"
fi

# ---------------------------------------------------------------- summary
"$PY" - "$WORK" "$OUT_DIR" "$DEV" <<'EOF'
import json, platform, sys
from pathlib import Path

work, out, dev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
import torch

from rollcap.rollout.recording import iter_episodes
from rollcap.rollout.recording.codec import episode_digest

summary = {"device": torch.cuda.get_device_name(0) if dev == "cuda" and torch.cuda.is_available() else platform.processor() or "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(), "steps": [], "digests": {}}
steps = work / "steps.jsonl"
summary["steps"] = [json.loads(line) for line in steps.read_text().splitlines()] if steps.exists() else []
for p in ("fp32", "bf16", "lean-bf16", "lean-fp8"):
    runs = [work / f"run-{p}-{r}" for r in "ab"]
    if all(r.exists() for r in runs):
        digests = [[episode_digest(rec) for _, rec in iter_episodes(r / "episodes") if not isinstance(rec, Exception)] for r in runs]
        same = sum(a == b for a, b in zip(*digests))
        summary["digests"][p] = {"episodes": [len(d) for d in digests], "identical": same}
        print(f"digests {p}: {same} of {len(digests[0])} episodes identical across two processes")
for p in ("lean-bf16", "lean-fp8"):  # success rates of the shipped policy at the new settings (few episodes: noisy)
    f = work / f"run-{p}-a" / "summary.json"
    if f.exists():
        summary.setdefault("success", {})[p] = json.loads(f.read_text()).get("success_rate")
(out / "summary.json").write_text(json.dumps(summary, indent=1))
kern = out / "kernels.json"
if kern.exists():  # issue 42's short table, last
    r = json.loads(kern.read_text())
    sets = r["settings"]
    print(f"\nbatch-1 chunk ms, median of {r['reps']} alternating rounds ({r['device']}); x = over today's fused-bf16:")
    print(f"{'size':<9}" + "".join(f"{s:>22}" for s in sets))
    for name, s in r["sizes"].items():
        cells = []
        for k in sets:
            c = s.get("settings", {}).get(k, {})
            ok = "" if c.get("exact", True) else "!"
            cells.append(f"{c['chunk_ms']:.2f}{ok} ({c.get('over_today', 1):.2f}x)" if "chunk_ms" in c else ("n/a" if str(c.get("error", "")).startswith("not taken") else "error" if "error" in c or "error" in s else "-"))
        print(f"{name:<9}" + "".join(f"{x:>22}" for x in cells))
    for name, s in r["sizes"].items():
        shares = {k: c["between_gemms_share"] for k, c in s.get("settings", {}).items() if "between_gemms_share" in c}
        if shares and name in ("3b", "205m") or (shares and r["device"] == "cpu"):
            print(f"{name}: adds+norms+casts+copies+GELU share of kernel time: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))
    print("(! = replay not byte-equal to its own eager chunk)")
for name in ("bench_host.json", "bench_i57_host.json"):
    host = out / name
    if host.exists():
        h = json.loads(host.read_text()).get("host", {})
        if "host_overhead_ms_median" in h:
            print(f"host overhead at batch 1 (real runners): {h['host_overhead_ms_median']:.3f} ms = {h['host_overhead_fraction']:.1%} of a {h['boundary_ms_median']:.2f} ms boundary")
workers = out / "bench_i57_workers.json"
if workers.exists():  # issue 57: episodes/s, the GPU's busy share and the model beside each
    b = json.loads(workers.read_text()).get("batch", {})
    for k, rs in b.get("runs", {}).items():
        eps, busy = sorted(r["episodes_per_s"] for r in rs), sorted(r["policy_busy_fraction"] for r in rs)
        c = b.get("model", {}).get("check", {}).get(k, {})
        model = f", model {c['predicted']:.1f}" if "predicted" in c else ""
        print(f"{k}: {eps[len(eps) // 2]:.1f} episodes/s, GPU (policy) busy {busy[len(busy) // 2]:.0%}{model}")
sw = out / "bench_i57_startup_writer.json"
if sw.exists():
    r = json.loads(sw.read_text())
    for k, c in r.get("startup", {}).get("cases", {}).items():
        print(f"{k}: {c['s']:.2f} s, {c['rss_mb']:.0f} MB (torch first: {c['torch_s']:.2f} s, {c['torch_rss_mb']:.0f} MB)")
    w = r.get("startup", {}).get("worker")
    if w:
        print(f"env worker spawn to ready: {w['start_s']:.2f} s, {w['rss_mb']:.0f} MB, torch {w['held_torch']}")
    for k, v in r.get("recording", {}).get("writer", {}).items():
        print(f"writer CPU per episode, {k}: {v['median_ms']:.2f} ms")
if "success" in summary:
    print("shipped policy success rate, lean: " + ", ".join(f"{k} {v}" for k, v in summary["success"].items()))
bad = [s["step"] for s in summary["steps"] if s["rc"] != 0]
print("gpu_check:", "all steps passed" if not bad else "failed steps: " + ", ".join(bad))
EOF
rm -rf "$WORK"
