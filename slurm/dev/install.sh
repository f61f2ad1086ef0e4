#!/usr/bin/env bash
# Install the Debian packages of the local dev Slurm cluster (idempotent; a fast no-op when present).
#   slurm-wlm (slurmctld, slurmd, client tools), munge, slurmdbd, mariadb-server (for sacct).
# Runs apt-get update only when a package is missing. Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail
packages=(slurm-wlm munge slurmdbd mariadb-server)
missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "slurm/dev/install.sh: missing packages ${missing[*]} and no apt-get on this machine;" \
    "install Slurm (slurmctld, slurmd, slurmdbd) and MariaDB yourself" >&2
  exit 1
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "slurm/dev/install.sh: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "slurm/dev/install.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
# policy-rc.d 101: Debian's maintainer scripts must not try to start the system daemons (no systemd here);
# start.sh runs its own instances under the state dir.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod 755 "$policy"
  created_policy=1
fi
rc=0
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
[ "$created_policy" -eq 1 ] && "${sudo_cmd[@]}" rm -f "$policy"
if [ "$rc" -ne 0 ]; then
  echo "slurm/dev/install.sh: apt-get install ${missing[*]} failed (exit $rc)" >&2
  exit "$rc"
fi
