#!/usr/bin/env bash
# Set Fleet up and run its main job offline: execute notebooks/quickstart.ipynb through the fleet
# kernel with the recorded (scripted) model, and write the executed notebook and an HTML transcript.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m fleet_kernel.demo "$@"
