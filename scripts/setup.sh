#!/usr/bin/env bash
# Set up Fleet on a fresh Debian/Ubuntu machine: system packages, a virtual environment, the package
# with its extras, the offline Pyodide cache, and the kernelspec. Safe to run again.
#   FLEET_SETUP_TEST=1  also install what the test suite needs (PostgreSQL, Chromium, test extras)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

apt_packages=(bubblewrap libseccomp2 python3-venv)
if [[ "${FLEET_SETUP_TEST:-0}" == 1 ]]; then
  apt_packages+=(postgresql chromium fonts-dejavu-core)
fi
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "Installing system packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  say "Creating .venv with $($PYTHON --version)"
  $PYTHON -m venv .venv
fi
extras="daytona,pyodide,lab"
[[ "${FLEET_SETUP_TEST:-0}" == 1 ]] && extras="$extras,test"
say "Installing fleet-kernel[$extras] into .venv"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[$extras]"

if [[ "${FLEET_SETUP_TEST:-0}" == 1 ]]; then
  # fleet-rlm's own terminal client, for tests/api/test_fleet_rlm_client.py. Its package pins versions of
  # fastapi and others that Fleet's differ from, so it goes, without its dependencies, into a folder of
  # its own that only the client's process puts on its path (with textual, the one it needs that
  # Fleet does not install).
  say "Installing the fleet-rlm 0.8.1 client into .cache/fleet-rlm-client"
  .venv/bin/python -m pip install -q --no-deps --upgrade --target .cache/fleet-rlm-client \
    fleet-rlm==0.8.1 textual==8.2.8
fi

say "Caching Pyodide for offline use"
.venv/bin/python -c "from fleet_kernel.sandbox.pyodide import ensure_pyodide; ensure_pyodide()" \
  || echo "   (Pyodide cache not prepared; the pyodide sandbox stays unavailable, the local one is unaffected)"

say "Checking the sandbox"
FLEET_HOME="${FLEET_HOME:-$PWD/.fleet}" .venv/bin/fleet doctor sandbox || true
