#!/usr/bin/env bash
# Stop the A100-shaped cluster of slurm/a100/start.sh: cancel its jobs, then TERM (KILL after a grace
# period) exactly the PIDs recorded under <state>/run/ (each checked against its start time, so a reused
# PID is never signalled). Safe to call twice. State dir: ${HPCRL_A100_DIR:-<repo>/.slurm-a100}; its logs
# stay for inspection (the next start wipes them).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${HPCRL_A100_DIR:-$(cd "$here/../.." && pwd)/.slurm-a100}"
run="$state/run"
# shellcheck source=slurm/dev/pids.sh
source "$here/../dev/pids.sh"
say() { echo "slurm/a100/stop.sh: $*"; }

if [ ! -d "$run" ] || ! any_recorded_pid_alive "$run"; then
  rm -f "$run"/*.pid 2>/dev/null
  rm -f "$state/cluster.json"
  say "nothing running (state $state)"
  exit 0
fi
if recorded_pid_alive "$run" slurmctld && [ -f "$state/etc/slurm.conf" ]; then
  export SLURM_CONF="$state/etc/slurm.conf"
  jobs="$(timeout 5 squeue -h -o %A 2>/dev/null | sort -u)"
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 1 60); do
      [ -z "$(timeout 5 squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.25
    done
  fi
fi

# A slurmd whose slurmctld is gone ignores TERM while it retries to register: slurmd's first.
# shellcheck disable=SC2046
stop_group "$run" 10 $(recorded_names "$run" | grep '^slurmd-' || true)
stop_group "$run" 10 slurmctld
# shellcheck disable=SC2046
stop_group "$run" 5 $(recorded_names "$run")
rm -f "$state/cluster.json" "$run"/*.daemon.pid
say "stopped (state $state)"
