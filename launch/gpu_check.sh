#!/usr/bin/env bash
# GPU acceptance check, sized for the GPU machine this project can be lent (one H200, python3 = Python
# 3.12 with torch 2.11 + CUDA 13 and transformers; no vLLM, no megatron-core; nothing reachable from it;
# 15 device-minutes a session). One device call, < 8 minutes:
#   here:   bash launch/gpu_wheels.sh                    # megatron-core, submitit, jsonargparse -> .whl/
#   device: run(command="bash launch/gpu_check.sh", carry=[".whl"], timeout_s=540)
# It installs the carried wheels (no torch install: the image's torch is used), runs every `gpu`-marked test
# that one GPU can run, two short GRPO runs on the GPU (HF rollout engine; megatron rollout engine), and
# prints one summary table: tests pass/fail/skip, tok/s, step phases, peak GPU memory per phase; then what
# was not run and why (vLLM's CUDA wheel is not on the image; NCCL groups need >= 2 GPUs).
# Everything lands in $OUT (the device tool's folder), else /tmp/hpcrl-gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/hpcrl-gpu-check}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hpcrl-site \
  .whl/*.whl || { echo "gpu_check: carry .whl (bash launch/gpu_wheels.sh here first)" >&2; exit 3; }
export PYTHONPATH="/tmp/hpcrl-site:$PWD" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -o addopts="" -q -rA \
  --junitxml "$OUT/gpu-tests.xml" tests 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
timeout 200 python3 benchmarks/gpu_check.py --out "$OUT" --junit "$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/summary.txt"
