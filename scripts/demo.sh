#!/usr/bin/env bash
# Set Fleet up and run its main job offline: execute notebooks/quickstart.ipynb through the fleet
# kernel with the recorded (scripted) model, and write the executed notebook and an HTML transcript.
#   scripts/demo.sh [--out DIR] [--check]
#     --check  run nothing: check the set-up (scripts/setup.sh --check) and what the demo needs
# The first run sets everything up (scripts/setup.sh: system packages, .venv, a few minutes), each step
# printed with how long it took; later runs start the demo in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ " $* " == *" --check "* ]]; then
  bash scripts/setup.sh --check
  say "Checking what the demo needs"
  check "python -m fleet_kernel.demo --check" "$PY" -m fleet_kernel.demo --check
  check_done demo.sh
fi
step "Setting up (scripts/setup.sh)" bash scripts/setup.sh
say "Running the demo"
exec "$PY" -m fleet_kernel.demo "$@"
