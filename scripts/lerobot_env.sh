#!/usr/bin/env bash
# Build (or check) the LeRobot environment: a separate venv, never rollcap's main one.
#
# lerobot==0.6.1 needs Python >= 3.12 and torch>=2.7,<2.12, while rollcap's main
# environment is Python 3.11 with torch 2.13, so LeRobot lives in its own venv:
#   $ROLLCAP_LEROBOT_VENV, default .venv-lerobot in the repository root.
# It holds lerobot (extras dataset, training, diffusers-dep, viz: rerun-sdk for lerobot-dataset-viz), a torch its pin admits (torch==2.11.0: PyPI has no CPU-only
# x86_64 wheel of any admitted version, so this is the CUDA build; it runs on CPU),
# minari==0.5.4, h5py, pytest, matplotlib (`rollcap inspect --plot`), Ray (rollcap's `ray` extra: `rollcap run --policy
# lerobot:DIR --actors N`) and rollcap itself (editable, --no-deps, then rollcap's
# own dependencies minus torch, all in one resolve with lerobot's).
#
# Video decoding: LeRobot decodes with torchcodec when it is importable, and torchcodec
# loads FFmpeg's shared libraries (major 4 to 8) from the system, which pip cannot
# install. Where they are missing, every LeRobotDataset(...) printed ~100 lines of
# torchcodec's traceback before falling back to PyAV, and lerobot-info exited 1. PyAV
# (a lerobot[dataset] dependency) bundles its own FFmpeg, so a torchcodec that cannot
# load is removed: LeRobot then picks PyAV by itself, quietly. With the system's FFmpeg
# (e.g. apt-get install ffmpeg) torchcodec stays.
#
# Idempotent: an existing venv that already has all of it is left as it is
# (seconds). pip's wheel cache is kept, so rebuilding on the same machine does
# not download again. Pip's output goes to $VENV/lerobot_env.log.
# Environment: ROLLCAP_LEROBOT_VENV, ROLLCAP_LEROBOT_PYTHON (a python >= 3.12),
# ROLLCAP_LEROBOT_TORCH (the torch requirement, default torch==2.11.0).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
VENV=${ROLLCAP_LEROBOT_VENV:-$REPO/.venv-lerobot}
TORCH=${ROLLCAP_LEROBOT_TORCH:-torch==2.11.0}
LEROBOT="lerobot[dataset,training,diffusers-dep,viz]==0.6.1"  # datasets (v3 export), lerobot-train, Diffusion Policy, lerobot-dataset-viz
MINARI=minari==0.5.4
start=$SECONDS

find_python() {
  local c
  for c in "${ROLLCAP_LEROBOT_PYTHON:-}" python3.12 python3.13 \
           "$HOME"/.pyenv/versions/3.12.*/bin/python "$HOME"/.pyenv/versions/3.13.*/bin/python; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  echo "lerobot_env.sh: lerobot 0.6.1 needs Python >= 3.12 and none was found; set ROLLCAP_LEROBOT_PYTHON=/path/to/python3.12" >&2
  return 1
}

# Everything is there already: lerobot at its version, minari, h5py, pytest, rerun,
# a video decoder that loads (torchcodec with the system's FFmpeg, or none: PyAV),
# and rollcap importing from this checkout.
ready() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$REPO" <<'PY' 2>/dev/null
import importlib.util, os, sys
from importlib.metadata import version
import av, diffusers, h5py, lerobot.datasets, matplotlib, minari, pytest, ray, rerun, rollcap, torch  # noqa: F401
if importlib.util.find_spec("torchcodec"):
    import torchcodec  # noqa: F401  (raises where the system's FFmpeg is missing)
assert version("lerobot") == "0.6.1" and version("minari") == "0.5.4"
assert os.path.realpath(os.path.dirname(rollcap.__file__)) == os.path.realpath(os.path.join(sys.argv[1], "rollcap"))
PY
}

if ! ready; then
  [ -x "$VENV/bin/python" ] || "$(find_python)" -m venv "$VENV"
  log=$VENV/lerobot_env.log
  : >"$log"
  # rollcap's own runtime dependencies and its ray extra from pyproject.toml, minus torch (lerobot's pin decides).
  mapfile -t deps < <("$VENV/bin/python" - <<'PY'
import re, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
    for d in project["dependencies"] + project["optional-dependencies"]["ray"]:
        if re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower() != "torch":
            print(d)
PY
)
  pipi() { "$VENV/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1 ||
           { tail -n 30 "$log" >&2; echo "lerobot_env.sh: pip install failed; full log: $log" >&2; exit 1; }; }
  pipi --upgrade pip
  pipi "$LEROBOT" "$TORCH" "$MINARI" h5py pytest "matplotlib>=3.7" "${deps[@]}"
  pipi --no-deps -e .
  if ! "$VENV/bin/python" -c 'import torchcodec' >/dev/null 2>&1; then  # no FFmpeg for it here: LeRobot decodes with PyAV
    "$VENV/bin/python" -m pip uninstall -y torchcodec >>"$log" 2>&1
  fi
  ready || { echo "lerobot_env.sh: installed, but the check import failed; see $log" >&2; exit 1; }
fi
"$VENV/bin/python" - "$VENV" $((SECONDS - start)) <<'PY'
import importlib.util, sys, platform
from importlib.metadata import version
decoder = f"torchcodec {version('torchcodec')}" if importlib.util.find_spec("torchcodec") else f"PyAV {version('av')}"
print(f"lerobot_env.sh: {sys.argv[1]} ready in {sys.argv[2]} s (python {platform.python_version()}, "
      f"lerobot {version('lerobot')}, torch {version('torch')}, minari {version('minari')}, video decoding: {decoder}); "
      f"run: {sys.argv[1]}/bin/python -m pytest -q -m lerobot tests/lerobot")
PY
