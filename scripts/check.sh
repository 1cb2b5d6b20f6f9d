#!/usr/bin/env bash
# The static gate, run before the tests: lint, formatting and types (rules in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" -m mypy
