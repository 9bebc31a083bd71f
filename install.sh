#!/usr/bin/env bash
# Install rollcap and what it needs, choosing torch sensibly:
#  - a torch already installed (e.g. a CUDA build) is kept as it is;
#  - otherwise, with an NVIDIA GPU visible, the default (CUDA) torch wheel is installed;
#  - otherwise the CPU build torch==2.13.0 (no multi-GB CUDA download).
# Extra pip arguments are passed on, e.g. `bash install.sh --user`.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if "$PY" -c "import torch" 2>/dev/null; then
  echo "install.sh: keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "$PY" -m pip install -q "$@" torch
else
  "$PY" -m pip install -q "$@" torch==2.13.0
fi
"$PY" -m pip install -q "$@" -e ".[all]"
echo "install.sh: rollcap installed; try: rollcap run"
