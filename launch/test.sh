#!/usr/bin/env bash
# README's second command: set up everything and run ALL tests.
#   venv + hpcrl[dev] -> Debian packages for Slurm -> start the dev Slurm cluster (slurmctld, 4 slurmd,
#   slurmdbd + MariaDB) -> ruff -> pytest -> stop the cluster by its recorded PIDs, even on failure.
# Extra arguments go to pytest (e.g. `launch/test.sh -k reshard`).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/setup_env.sh dev
bash slurm/dev/install.sh
trap 'bash slurm/dev/stop.sh' EXIT
bash slurm/dev/start.sh
export HPCRL_REQUIRE_SLURM=1
ruff check .
ruff format --check .
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "launch/test.sh: pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
