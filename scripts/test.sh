#!/usr/bin/env bash
# Set up everything the tests need (system packages, .venv, PostgreSQL) and run the whole suite:
# once on SQLite, then the store and API suites again on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
FLEET_SETUP_TEST=1 bash scripts/setup.sh

# PostgreSQL for the store and API suites (Debian's server, on loopback).
PG_URL=""
if command -v pg_lsclusters >/dev/null 2>&1; then
  cluster=$(pg_lsclusters -h | awk 'NR==1 {print $1" "$2}')
  if [[ -n "$cluster" ]]; then
    pg_ctlcluster $cluster start 2>/dev/null || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 && break; sleep 0.5; done
    if pg_isready -q -h 127.0.0.1; then
      su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'fleet'\"" >/dev/null
      su postgres -c "dropdb --if-exists fleet_test && createdb fleet_test"
      PG_URL="postgresql+asyncpg://postgres:fleet@127.0.0.1:5432/fleet_test"
    fi
  fi
fi

.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [[ -n "$PG_URL" && $# -eq 0 ]]; then
  echo "==> store and API suites on PostgreSQL"
  FLEET_TEST_DATABASE_URL="$PG_URL" .venv/bin/python -m pytest -q -p no:cacheprovider -m "not browser" tests/test_store.py tests/api
fi
