#!/usr/bin/env bash
# The static gate, run before the tests: lint, formatting and types (their rules are in pyproject.toml).
# Runs every check and fails if any did, so one run shows everything to fix.
#   scripts/check.sh [--check]   (--check: only check that ruff and mypy run)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
PY=${PYTHON:-$PY}
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  check "ruff" "$PY" -m ruff --version
  check "mypy" "$PY" -m mypy --version
  check_done check.sh
fi
failed=()
"$PY" -m ruff check . || failed+=("ruff check")
"$PY" -m ruff format --check . || failed+=("ruff format --check (fix: ruff format .)")
"$PY" -m mypy || failed+=("mypy")
if ((${#failed[@]})); then
  printf 'static gate failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "static gate passed"
