#!/usr/bin/env bash
# Stop the dev Slurm cluster started by start.sh: cancel its jobs, then TERM (KILL after a grace period)
# exactly the PIDs recorded under <state>/run/, never anything found by name. Safe to call twice.
# State dir: ${HPCRL_SLURM_DIR:-<repo>/.slurm-dev}. The database and configs stay for the next start.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${HPCRL_SLURM_DIR:-$(cd "$here/../.." && pwd)/.slurm-dev}"
run="$state/run"
# shellcheck source=slurm/dev/pids.sh
source "$here/pids.sh"
say() { echo "slurm/dev/stop.sh: $*"; }

if [ ! -d "$run" ] || ! any_recorded_pid_alive "$run"; then
  rm -f "$run"/*.pid 2>/dev/null
  say "nothing running (state $state)"
  exit 0
fi

# Jobs first, through Slurm itself, so that no slurmstepd or job process outlives its slurmd.
if recorded_pid_alive "$run" slurmctld && [ -f "$state/etc/slurm.conf" ]; then
  export SLURM_CONF="$state/etc/slurm.conf"
  jobs="$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u)"
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 1 40); do
      [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
fi

names="$(recorded_names "$run")"
slurmds="$(echo "$names" | grep '^slurmd-' || true)"
# shellcheck disable=SC2086
stop_group "$run" 10 $slurmds slurmctld
stop_group "$run" 10 slurmdbd
stop_group "$run" 20 mariadb munged
# Anything else recorded (should be none).
# shellcheck disable=SC2046
stop_group "$run" 5 $(recorded_names "$run")
rm -f "$state/cluster.json" "$run"/*.daemon.pid
say "stopped (state $state)"
