#!/usr/bin/env bash
# Create .venv and install hpcrl into it (sourced by quickstart.sh and test.sh).
# On a machine without CUDA, torch is pinned to 2.13.0 (the CPU build where one is offered, as here) so that
# no resolver pulls a multi-GB CUDA build; on a GPU machine the default torch wheel is used. Installs go
# through launch/pip_or_uv.sh (a clean clone: 27 s where pip took ~65 s; HPCRL_PIP=1 for pip).
# Usage: source launch/setup_env.sh [extras]   e.g. `source launch/setup_env.sh dev`
set -euo pipefail
HPCRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HPCRL_VENV="${HPCRL_VENV:-$HPCRL_ROOT/.venv}"
extras="${1:-}"
if [ ! -x "$HPCRL_VENV/bin/python" ]; then
  python3 -m venv "$HPCRL_VENV"
fi
# shellcheck disable=SC1091
source "$HPCRL_VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck disable=SC1091
source "$HPCRL_ROOT/launch/pip_or_uv.sh"  # venv_install: uv where it can, else pip
torch_spec=()
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    torch_spec=("torch>=2.4,<2.15")
  else
    torch_spec=("torch==2.13.0")
  fi
fi
target="$HPCRL_ROOT"
[ -n "$extras" ] && target="$HPCRL_ROOT[$extras]"
venv_install "${torch_spec[@]}" -e "$target"
python -c "import hpcrl" || { echo "setup_env: hpcrl failed to install into $HPCRL_VENV" >&2; exit 1; }
