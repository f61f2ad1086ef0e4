#!/usr/bin/env bash
# Download, HERE (a machine that reaches PyPI), the pure-Python wheels that launch/gpu_check.sh installs on
# the lent GPU machine (Python 3.12 with its own torch 2.11 + CUDA 13, transformers, h5py, ...; no
# megatron-core, submitit or jsonargparse; nothing reachable from it).
# ~3.7 MB into .whl/ (git-ignored; the device call names it in `carry`). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "megatron-core==0.16.1" "submitit==1.5.4" "jsonargparse==4.53.0" "docstring-parser==0.18.0" \
  "typeshed-client==2.15.0" 2>&1 | grep -v -E "^WARNING: (Location|Skipping)" || true
ls .whl
