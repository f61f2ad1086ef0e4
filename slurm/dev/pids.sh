# PID bookkeeping shared by the dev and A100-shaped clusters' start.sh and stop.sh (sourced, not run).
# A record <run>/<name>.pid holds "<pid> <start time>": the start time (field 22 of /proc/<pid>/stat)
# tells our daemon from an unrelated process that reused its PID, so stop never kills a stranger.

proc_start_time() {  # proc_start_time <pid>: prints the start time, fails if gone or a zombie
  local stat rest
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  rest="${stat##*) }"  # fields after "(comm)", which may itself hold spaces
  # shellcheck disable=SC2086
  set -- $rest
  [ "$1" != "Z" ] && [ "$1" != "X" ] || return 1
  echo "${20}"
}

record_pid() {  # record_pid <run dir> <name> <pid>
  local start
  start="$(proc_start_time "$3")" || start=unknown
  echo "$3 $start" >"$1/$2.pid"
}

recorded_pid_alive() {  # recorded_pid_alive <run dir> <name>
  local pid start now
  [ -f "$1/$2.pid" ] || return 1
  read -r pid start <"$1/$2.pid" || return 1
  now="$(proc_start_time "$pid")" || return 1
  [ "$start" = unknown ] || [ "$now" = "$start" ]
}

recorded_names() {  # recorded_names <run dir>: names of all records
  local file
  for file in "$1"/*.pid; do
    [ -e "$file" ] || continue
    case "$file" in *.daemon.pid) continue ;; esac  # the daemons' own PID files, not our records
    file="${file##*/}"
    echo "${file%.pid}"
  done
}

recorded_pids_all_alive() {  # all records alive, and at least one record
  local name found=0
  for name in $(recorded_names "$1"); do
    found=1
    recorded_pid_alive "$1" "$name" || return 1
  done
  [ "$found" -eq 1 ]
}

any_recorded_pid_alive() {
  local name
  for name in $(recorded_names "$1"); do
    recorded_pid_alive "$1" "$name" && return 0
  done
  return 1
}

stop_group() {  # stop_group <run dir> <grace seconds> <name...>: TERM, wait, KILL what is left
  local run="$1" grace="$2" name pid start alive waited=0
  shift 2
  for name in "$@"; do
    recorded_pid_alive "$run" "$name" || continue
    read -r pid start <"$run/$name.pid"
    kill -TERM "$pid" 2>/dev/null
  done
  while :; do
    alive=()
    for name in "$@"; do recorded_pid_alive "$run" "$name" && alive+=("$name"); done
    [ "${#alive[@]}" -eq 0 ] && break
    if [ "$waited" -ge $((grace * 10)) ]; then
      for name in "${alive[@]}"; do
        read -r pid start <"$run/$name.pid"
        say "$name (pid $pid) ignored TERM for ${grace}s: KILL"  # say: the sourcing script's
        kill -KILL "$pid" 2>/dev/null
      done
      sleep 0.2
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  for name in "$@"; do rm -f "$run/$name.pid"; done
}
