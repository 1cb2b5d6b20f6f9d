#!/usr/bin/env bash
# Set up Fleet on a fresh Debian/Ubuntu machine: system packages, a virtual environment, the package
# with its extras, the offline Pyodide cache, and the kernelspec. Safe to run again.
#   scripts/setup.sh [--check]
#     --check  install nothing: check that everything set-up installs is there and that its commands run
#   FLEET_SETUP_TEST=1  also install what the static gate and the test suite need (PostgreSQL, Chromium, the dev extra)
#   FLEET_VENV (.venv)  the virtual environment to create and install into
# Installing system packages needs root (or sudo). Each step prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

mode=install
case "${1:-}" in
  --check) mode=check ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

apt_packages=(bubblewrap libseccomp2 python3-venv)
extras="daytona,pyodide,lab,mcp"
if [[ "${FLEET_SETUP_TEST:-0}" == 1 ]]; then
  apt_packages+=(postgresql chromium fonts-dejavu-core)
  extras="$extras,dev"  # dev: the postgres and telemetry extras, pytest and its plugins, ruff, mypy
fi

if [[ $mode == check ]]; then
  say "Checking what scripts/setup.sh installs (nothing is installed)"
  for pkg in "${apt_packages[@]}"; do check "system package $pkg" has_package "$pkg"; done
  check "virtual environment $VENV" test -x "$PY"
  check "fleet-kernel imports" "$PY" -c "import fleet_kernel, fleet_api"
  check "fleet --help" "$VENV/bin/fleet" --help
  check "fleet serve --help" "$VENV/bin/fleet" serve --help
  check "fleet doctor --help" "$VENV/bin/fleet" doctor --help
  check "the extras' packages ($extras)" "$PY" -c "import daytona, deno, jupyterlab, papermill, nbclient, nbconvert, mcp"
  check "the fleet kernelspec" "$PY" -c "from jupyter_client.kernelspec import KernelSpecManager as M; M().get_kernel_spec('fleet')"
  check "jupyter console" "$VENV/bin/jupyter-console" --help
  if [[ "${FLEET_SETUP_TEST:-0}" == 1 ]]; then
    check "the dev extra" "$PY" -c "import pytest, pexpect, playwright, asyncpg, ruff, mypy"
  fi
  check_done setup.sh
fi

missing=()
for pkg in "${apt_packages[@]}"; do has_package "$pkg" || missing+=("$pkg"); done
install_system_packages() {
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
if ((${#missing[@]})); then
  step "Installing system packages: ${missing[*]}" install_system_packages
fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x $PY ]]; then
  step "Creating $VENV with $($PYTHON --version)" "$PYTHON" -m venv "$VENV"
fi
install_package() {
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e ".[$extras]"
}
step "Installing fleet-kernel[$extras] into $VENV" install_package

if [[ "${FLEET_SETUP_TEST:-0}" == 1 ]]; then
  # fleet-rlm's own terminal client, for tests/api/test_fleet_rlm_client.py. Its package pins versions of
  # fastapi and others that Fleet's differ from, so it goes, without its dependencies, into a folder of
  # its own that only the client's process puts on its path (with textual, the one it needs that
  # Fleet does not install).
  install_reference_client() {
    "$PY" -m pip install -q --no-deps --upgrade --target .cache/fleet-rlm-client fleet-rlm==0.8.1 textual==8.2.8
  }
  step "Installing the fleet-rlm 0.8.1 client into .cache/fleet-rlm-client" install_reference_client
fi

cache_pyodide() {
  "$PY" -c "from fleet_kernel.sandbox.pyodide import ensure_pyodide; ensure_pyodide()" \
    || echo "   (Pyodide cache not prepared; the pyodide sandbox stays unavailable, the local one is unaffected)"
}
step "Caching Pyodide for offline use" cache_pyodide

say "Checking the sandbox"
FLEET_HOME="${FLEET_HOME:-$PWD/.fleet}" "$VENV/bin/fleet" doctor sandbox || true
