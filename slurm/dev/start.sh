#!/usr/bin/env bash
# Start a REAL single-host Slurm cluster for development and tests (Slurm 22.05 as packaged by Debian 12):
#   munged (own key and socket) -> MariaDB on 127.0.0.1 (own datadir) -> slurmdbd (so sacct works; submitit
#   relies on it) -> slurmctld -> 4 slurmd fake nodes node1..node4 (2 CPUs each), partition `debug` (default).
#
# Everything (configs, logs, sockets, spool, database, PID files) lives under ONE state directory:
#   ${HPCRL_SLURM_DIR:-<repo>/.slurm-dev}
# Ports (override to run a second instance): HPCRL_SLURMCTLD_PORT (16817), HPCRL_SLURMDBD_PORT (16819),
#   HPCRL_SLURMD_PORT (16821; nodes use it and the next 3), HPCRL_MARIADB_PORT (16306).
# A second instance on the same host also needs HPCRL_SLURM_FIRST_JOB_ID (1), e.g. 5000: job ids become
#   rendezvous ports (hpcrl.distributed.env.port_for_job), and two clusters both counting from 1 run jobs
#   with equal ids at once, whose ranks then collide on one port (EADDRINUSE).
# Writes <state>/slurm.env (source it: exports SLURM_CONF) and <state>/cluster.json.
# Idempotent: exits 0 at once when the recorded daemons are alive and `scontrol ping` answers.
# On failure: names the daemon and its log (last lines printed), stops what it started, exits 1.
# Stop with slurm/dev/stop.sh (kills only the PIDs recorded under <state>/run/).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${HPCRL_SLURM_DIR:-$repo/.slurm-dev}"
mkdir -p "$state"
state="$(cd "$state" && pwd)"
case "$state" in *[[:space:]]*)
  echo "slurm/dev/start.sh: state dir '$state' contains whitespace, which slurm.conf cannot express" >&2; exit 2 ;;
esac
ctld_port="${HPCRL_SLURMCTLD_PORT:-16817}"
dbd_port="${HPCRL_SLURMDBD_PORT:-16819}"
slurmd_port="${HPCRL_SLURMD_PORT:-16821}"
db_port="${HPCRL_MARIADB_PORT:-16306}"
first_job_id="${HPCRL_SLURM_FIRST_JOB_ID:-1}"
cluster_name=hpcrldev
partition=debug
nodes=(node1 node2 node3 node4)
cpus_per_node=2

etc="$state/etc" log="$state/log" run="$state/run" spool="$state/spool"
munge_dir="$state/munge" db_dir="$state/mariadb"
munge_socket="$munge_dir/munge.socket"
db_socket="$db_dir/mariadb.sock"
export SLURM_CONF="$etc/slurm.conf"

say() { echo "slurm/dev/start.sh: $*"; }

# ---- already running? -------------------------------------------------------------------------------
# shellcheck source=slurm/dev/pids.sh
source "$here/pids.sh"
if recorded_pids_all_alive "$run" && timeout 5 scontrol ping 2>/dev/null | grep -q "is UP"; then
  say "already running (state $state); source $state/slurm.env"
  exit 0
fi
if any_recorded_pid_alive "$run"; then
  say "a previous instance is half-alive: stopping it first"
  HPCRL_SLURM_DIR="$state" bash "$here/stop.sh"
fi

for exe in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sacctmgr scontrol sinfo; do
  command -v "$exe" >/dev/null 2>&1 || { say "'$exe' not found: run slurm/dev/install.sh first" >&2; exit 1; }
done
mkdir -p "$etc" "$log" "$run" "$spool/ctld" "$munge_dir" "$db_dir"
for node in "${nodes[@]}"; do mkdir -p "$spool/$node"; done
chmod 755 "$munge_dir"  # munged refuses a socket directory others may write to; clients need to reach it

fail() {  # fail <daemon> <log file> <what happened>
  local console="$log/${1// /-}.console"
  {
    echo "slurm/dev/start.sh: $1 failed: $3"
    echo "  log: $2 (last lines below)"
    if [ -s "$2" ]; then
      tail -n 15 "$2" | sed 's/^/  | /'
    elif [ -s "$console" ]; then  # died before opening its log: its stderr says why
      echo "  (log is empty; console output $console:)"
      tail -n 15 "$console" | sed 's/^/  | /'
    fi
    echo "slurm/dev/start.sh: stopping everything this start launched"
  } >&2
  HPCRL_SLURM_DIR="$state" bash "$here/stop.sh" >&2 || true
  exit 1
}

launch() {  # launch <name> <cmd...>: start a foreground daemon detached, record its PID
  local name="$1"; shift
  # setsid: own session, so a test runner's process-group signals don't reach the daemons.
  # The daemons write their own log files; stdout/stderr (early failures) go to <name>.console.
  setsid "$@" >"$log/$name.console" 2>&1 </dev/null &
  record_pid "$run" "$name" "$!"
}

wait_until() {  # wait_until <seconds> <name> <log> <check cmd...>: poll, fail early if the daemon died
  local seconds="$1" name="$2" logfile="$3"; shift 3
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    recorded_pid_alive "$run" "$name" || fail "$name" "$logfile" "the process exited during startup"
    [ "$SECONDS" -lt "$deadline" ] || fail "$name" "$logfile" "not ready after ${seconds}s"
    sleep 0.2
  done
}

port_free() {  # port_free <port>: nothing listens on 127.0.0.1:<port>
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# ---- munged -----------------------------------------------------------------------------------------
if [ ! -s "$munge_dir/munge.key" ]; then
  dd if=/dev/urandom of="$munge_dir/munge.key" bs=1024 count=1 status=none
fi
chmod 400 "$munge_dir/munge.key"
rm -f "$munge_socket" "$munge_socket.lock"
launch munged munged --foreground --force --socket="$munge_socket" \
  --key-file="$munge_dir/munge.key" --pid-file="$run/munged.daemon.pid" --log-file="$log/munged.log" \
  --seed-file="$munge_dir/munged.seed"
munge_ok() { munge --socket="$munge_socket" -n | unmunge --socket="$munge_socket"; }
wait_until 10 munged "$log/munged.log" munge_ok

# ---- MariaDB (loopback, own datadir) ----------------------------------------------------------------
port_free "$db_port" || fail mariadb "$log/mariadb.log" "port $db_port (HPCRL_MARIADB_PORT) is already in use"
if [ ! -d "$db_dir/data/mysql" ]; then
  mariadb-install-db --no-defaults --datadir="$db_dir/data" --user=root --skip-test-db \
    --auth-root-authentication-method=socket >>"$log/mariadb.log" 2>&1 \
    || fail mariadb-install-db "$log/mariadb.log" "could not initialise $db_dir/data"
fi
launch mariadb mariadbd --no-defaults --datadir="$db_dir/data" --user=root \
  --socket="$db_socket" --port="$db_port" --bind-address=127.0.0.1 --pid-file="$run/mariadb.daemon.pid" \
  --log-error="$log/mariadb.log" --skip-name-resolve --skip-log-bin --performance-schema=OFF \
  --innodb-buffer-pool-size=32M --innodb-flush-log-at-trx-commit=2
db_ok() { mariadb-admin --no-defaults --socket="$db_socket" -u root ping; }
wait_until 30 mariadb "$log/mariadb.log" db_ok
mariadb --no-defaults --socket="$db_socket" -u root >>"$log/mariadb.log" 2>&1 <<'SQL' \
  || fail mariadb "$log/mariadb.log" "could not create the slurm database user"
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmdev';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
SQL

# ---- configs ----------------------------------------------------------------------------------------
node_lines=""
for i in "${!nodes[@]}"; do
  node_lines+="NodeName=${nodes[$i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((slurmd_port + i)) "
  node_lines+="CPUs=$cpus_per_node RealMemory=4000 State=UNKNOWN"$'\n'
done
cat >"$etc/slurm.conf" <<EOF
# Generated by slurm/dev/start.sh; regenerated on every start.
ClusterName=$cluster_name
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
# Own munged; cred_expire=5: a requeued job otherwise waits ~120 s before it may start again.
AuthType=auth/munge
AuthInfo=socket=$munge_socket,cred_expire=5
CredType=cred/munge
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/%n
SlurmctldPidFile=$run/slurmctld.daemon.pid
SlurmdPidFile=$run/slurmd-%n.daemon.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in containers: plain /proc process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Fake nodes may claim more than the host has (shared cores between the 4 slurmd).
SlurmdParameters=config_overrides
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
# SIGTERM -> SIGKILL. Short for the tests' cancels (submitit ignores TERM), long enough for a save after the
# time limit's TERM (tests/recovery/test_slurm_requeue.py; Slurm's default is 30).
KillWait=15
MinJobAge=3600
InactiveLimit=0
Waittime=0
ReturnToService=2
JobRequeue=1
MaxArraySize=10001
FirstJobId=$first_job_id
MaxJobCount=20000
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$munge_socket
$node_lines
PartitionName=$partition Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP
EOF
(umask 077 && cat >"$etc/slurmdbd.conf" <<EOF
# Generated by slurm/dev/start.sh (slurmdbd insists on mode 600).
AuthType=auth/munge
AuthInfo=socket=$munge_socket
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=root
LogFile=$log/slurmdbd.log
PidFile=$run/slurmdbd.daemon.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=slurmdev
StorageLoc=slurm_acct_db
EOF
)
chmod 600 "$etc/slurmdbd.conf"

# ---- slurmdbd + accounting setup --------------------------------------------------------------------
port_free "$dbd_port" || fail slurmdbd "$log/slurmdbd.log" "port $dbd_port (HPCRL_SLURMDBD_PORT) is already in use"
launch slurmdbd slurmdbd -D
dbd_ok() { timeout 5 sacctmgr -n -P list cluster format=cluster; }
wait_until 60 slurmdbd "$log/slurmdbd.log" dbd_ok
if ! timeout 10 sacctmgr -n -P list cluster format=cluster | grep -qx "$cluster_name"; then
  timeout 10 sacctmgr -i add cluster "$cluster_name" >>"$log/slurmdbd.log" 2>&1 \
    || fail sacctmgr "$log/slurmdbd.log" "could not add cluster $cluster_name"
fi
if ! timeout 10 sacctmgr -n -P list account format=account | grep -qx hpcrl; then
  timeout 10 sacctmgr -i add account hpcrl cluster="$cluster_name" Description=dev Organization=dev \
    >>"$log/slurmdbd.log" 2>&1 || fail sacctmgr "$log/slurmdbd.log" "could not add account hpcrl"
  timeout 10 sacctmgr -i add user root account=hpcrl cluster="$cluster_name" >>"$log/slurmdbd.log" 2>&1 || true
fi

# ---- slurmctld --------------------------------------------------------------------------------------
port_free "$ctld_port" || fail slurmctld "$log/slurmctld.log" "port $ctld_port (HPCRL_SLURMCTLD_PORT) is already in use"
launch slurmctld slurmctld -D -f "$SLURM_CONF"
ping_ok() { timeout 5 scontrol ping | grep -q "is UP"; }
wait_until 30 slurmctld "$log/slurmctld.log" ping_ok

# ---- slurmd fake nodes ------------------------------------------------------------------------------
for i in "${!nodes[@]}"; do
  node="${nodes[$i]}"
  port_free "$((slurmd_port + i))" \
    || fail "slurmd $node" "$log/slurmd-$node.log" "port $((slurmd_port + i)) (HPCRL_SLURMD_PORT+$i) is already in use"
  launch "slurmd-$node" slurmd -D -N "$node" -f "$SLURM_CONF"
done
nodes_idle() { [ "$(sinfo -h -N -p "$partition" -t idle -o %N | sort -u | wc -l)" -eq "${#nodes[@]}" ]; }
deadline=$((SECONDS + 30))
until nodes_idle; do
  for node in "${nodes[@]}"; do
    recorded_pid_alive "$run" "slurmd-$node" || fail "slurmd $node" "$log/slurmd-$node.log" "the process exited"
  done
  if [ "$SECONDS" -ge "$deadline" ]; then
    sinfo -N -p "$partition" >&2 || true
    fail "slurmd (node state)" "$log/slurmctld.log" "nodes not idle after 30s"
  fi
  sleep 0.2
done
sacct_ok() { timeout 5 sacct -n -X -S now; }
wait_until 20 slurmdbd "$log/slurmdbd.log" sacct_ok

# ---- handles for users and tests --------------------------------------------------------------------
printf 'export SLURM_CONF=%q\n' "$SLURM_CONF" >"$state/slurm.env"
node_json="$(printf '"%s",' "${nodes[@]}")"
cat >"$state/cluster.json" <<EOF
{
  "slurm_conf": "$SLURM_CONF",
  "partition": "$partition",
  "nodes": [${node_json%,}],
  "cpus_per_node": $cpus_per_node,
  "state_dir": "$state",
  "ports": {"slurmctld": $ctld_port, "slurmdbd": $dbd_port, "slurmd": $slurmd_port, "mariadb": $db_port}
}
EOF
say "up in ${SECONDS}s: ${#nodes[@]} nodes in partition '$partition', state $state"
say "use it with: source $state/slurm.env"
