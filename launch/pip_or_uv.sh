#!/usr/bin/env bash
# Sourced by launch/setup_env.sh and launch/setup_smollm2.sh, inside the activated venv: defines
# `venv_install ARGS...` (pip install's arguments), which installs through uv when it can. A clean clone's
# `pip install torch==2.13.0 -e .[dev]` took ~60 s of set-up on 2 cores (pip's resolver and unpacking);
# with uv the whole setup_env.sh takes 27 s, most of it compiling bytecode (below), with the same packages
# at the same versions (checked with `pip list --format=freeze`).
# --compile-bytecode: pip writes every module's .pyc at install, uv only when asked; without them each
# `python -B` process (multiprocessing's forkserver passes -B on from pytest) compiled torch,
# transformers and megatron-core from source at every start (a clean-clone suite took 24+ min, not 17).
# uv does not read pip's configuration: its sources and constraints (find-links, index URLs, constraint
# files, from `pip config list` and PIP_* variables) are handed to uv as UV_* variables, so both install
# from the same places. uv is bootstrapped into the venv by pip (UV_VERSION); if it cannot be, or
# HPCRL_PIP=1, everything goes through pip as before.
UV_VERSION="0.13.9"
quiet_pip() { grep -v -E "^WARNING: (Location|Skipping)" || true; }  # pip's find-links noise
_pip_setting() { pip config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | tail -1; }
_uv_from_pip() {
  local pair var value
  for pair in find-links:UV_FIND_LINKS index-url:UV_INDEX_URL extra-index-url:UV_EXTRA_INDEX_URL \
    constraint:UV_CONSTRAINT; do
    var="${pair##*:}"
    value="$(_pip_setting "${pair%%:*}")"
    if [ -n "$value" ] && [ -z "${!var:-}" ]; then export "$var=$value"; fi  # a UV_* set by hand wins
  done
  export UV_INDEX_STRATEGY="${UV_INDEX_STRATEGY:-unsafe-best-match}"  # pip's: the best version of any index
}
venv_install() {
  if [ "${HPCRL_PIP:-0}" != 1 ] && [ ! -x "$VIRTUAL_ENV/bin/uv" ]; then
    pip install -q "uv==$UV_VERSION" 2>&1 | quiet_pip
  fi
  if [ "${HPCRL_PIP:-0}" != 1 ] && [ -x "$VIRTUAL_ENV/bin/uv" ]; then
    (_uv_from_pip && uv pip install -q --compile-bytecode --python "$VIRTUAL_ENV/bin/python" "$@") && return 0
    echo "launch/pip_or_uv.sh: uv pip install failed: trying pip" >&2
  fi
  pip install -q "$@" 2>&1 | quiet_pip
}
