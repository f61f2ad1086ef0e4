#!/usr/bin/env bash
# README's first command: set up and run the main job (a tiny GRPO run on CPU, local executor).
# Extra arguments are passed to `hpcrl run` (e.g. `--algorithm.steps 20`).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/setup_env.sh
hpcrl info
exec hpcrl run templates/grpo_tiny.yaml "$@"
