#!/usr/bin/env bash
# `.ci/run` on a clean clone of HEAD with BUSY CPU-bound processes beside it (issue 41: a suite that
# passes on a busy machine). Two busy Python loops by default, started here and stopped by their PIDs
# on any exit; prints the wall time and exit code of each run.
#   bash launch/ci_under_load.sh [RUNS] [BUSY]        e.g. `bash launch/ci_under_load.sh 3 2`; BUSY=0: idle
set -euo pipefail
runs="${1:-1}"
busy="${2:-2}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
head="$(git -C "$repo" rev-parse --short HEAD)"
pids=()
stop_busy() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_busy EXIT
for _ in $(seq 1 "$busy"); do
  python3 -c "while True: pass" &
  pids+=("$!")
done
for run in $(seq 1 "$runs"); do
  clone="$(mktemp -d)/hpcrl"
  git clone -q "$repo" "$clone"
  start=$(date +%s)
  set +e
  (cd "$clone" && CI=true bash .ci/run) >"$clone.log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  summary="$(grep -E '^=+ .*(passed|failed).* =+$' "$clone.log" | tr '\n' ' ')"
  echo "ci_under_load: run $run of $head with $busy busy loops: rc $rc, $((took / 60)) min $((took % 60)) s; $summary(log $clone.log)"
  rm -rf "$clone"
done
