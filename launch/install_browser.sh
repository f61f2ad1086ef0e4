#!/usr/bin/env bash
# Install Debian's headless browser for the `hpcrl serve` page test (tests/serve/test_page_browser.py):
# chromium and its chromedriver, driven by selenium (the dev extra). Idempotent: a fast no-op when both
# are present; apt-get update only when one is missing. Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail
packages=(chromium chromium-driver)
missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "launch/install_browser.sh: missing ${missing[*]} and no apt-get here; install chromium and chromedriver" >&2
  exit 1
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "launch/install_browser.sh: need root or sudo for ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "launch/install_browser.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
