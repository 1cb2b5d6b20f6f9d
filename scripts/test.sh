#!/usr/bin/env bash
# Set up everything the tests need (system packages, .venv, PostgreSQL) and run the whole suite:
# once on SQLite, then the store and API suites again on PostgreSQL.
#   scripts/test.sh [PYTEST ARGS...]   e.g. tests/test_store.py, or -k history (then no PostgreSQL pass)
#   scripts/test.sh --check            run nothing: check the set-up and the tools the run uses
#   FLEET_TEST_WORKERS (cores + 2)      parallel pytest workers (pytest-xdist); -n 0 in the args runs serially
# Needs root (or sudo): it installs system packages (scripts/setup.sh with FLEET_SETUP_TEST=1) and, on
# Debian's PostgreSQL cluster, creates the role and database fleet_test (a new password each run; the
# postgres user is left as it is). Each set-up step prints how long it took; skipped tests say why.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

PG_ROLE=fleet_test
# Bytecode caches on: with PYTHONDONTWRITEBYTECODE set (as in many container images) every kernel, server and
# pytest worker compiles Fleet's modules again, and pytest rewrites every test module's asserts again: about
# 5 s of CPU per worker's collection alone. The caches go to __pycache__ folders git ignores.
unset PYTHONDONTWRITEBYTECODE
# Tests mostly wait (kernels starting, servers, sandboxes), so two more workers than cores keep them busy: on
# 2 cores the SQLite pass took 7.5 min with 3 workers, 6.3 with 4 and 6.4 with 5 (2026-12-07).
WORKERS=${FLEET_TEST_WORKERS:-$(($(nproc) + 2))}
PYTEST=("$PY" -m pytest -q -rs -p no:cacheprovider -n "$WORKERS" --dist worksteal)

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  FLEET_SETUP_TEST=1 bash scripts/setup.sh --check
  say "Checking what the test run needs"
  for tool in pg_lsclusters pg_ctlcluster pg_isready psql createdb runuser; do check "$tool" command -v "$tool"; done
  check "pytest" "${PYTEST[@]}" --version
  check_done test.sh
fi

as_postgres() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}

# The first cluster of Debian's PostgreSQL, started, with this suite's own role and a fresh database.
# Each pytest worker gets a database of its own, named after it (fleet_test_gw0, ...; tests/conftest.py).
# Prints the database URL, or nothing when there is no cluster to use.
start_postgres() {
  command -v pg_lsclusters >/dev/null 2>&1 || return 0
  local version name port password
  read -r version name port _ < <(pg_lsclusters -h | head -1) || return 0
  [[ -n ${port:-} ]] || return 0
  pg_ctlcluster "$version" "$name" start >/dev/null 2>&1 || true
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.5; done
  pg_isready -q -h 127.0.0.1 -p "$port" || return 0
  password=$("$PY" -c "import secrets; print(secrets.token_hex(16))")
  as_postgres psql -q -p "$port" -v ON_ERROR_STOP=1 >/dev/null <<SQL
SELECT 'CREATE ROLE $PG_ROLE' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE')\gexec
ALTER ROLE $PG_ROLE WITH LOGIN PASSWORD '$password';
SQL
  local db
  for db in "$PG_ROLE" $(seq -f "${PG_ROLE}_gw%g" 0 $((WORKERS - 1))); do
    as_postgres dropdb -p "$port" --if-exists "$db" 2>/dev/null
    as_postgres createdb -p "$port" -O "$PG_ROLE" "$db"
  done
  echo "postgresql+asyncpg://$PG_ROLE:$password@127.0.0.1:$port/$PG_ROLE"
}

step "Setting up (scripts/setup.sh with the test extras)" env FLEET_SETUP_TEST=1 bash scripts/setup.sh
PG_URL=""
if [[ $# -eq 0 ]]; then
  say "Starting PostgreSQL for the store and API suites (role and database $PG_ROLE)"
  started=$SECONDS
  PG_URL=$(start_postgres)
  if [[ -n $PG_URL ]]; then echo "    ready in $((SECONDS - started)) s"; else echo "    no PostgreSQL cluster: that pass is skipped"; fi
fi

say "Running the tests on SQLite"
if [[ $# -eq 0 ]]; then
  "${PYTEST[@]}" -m "not browser and not alone"
  # Chromium and JupyterLab each want the cores, and a Lab kernel started beside the parallel workers' load
  # sometimes never took its first cell; MLflow's server, beside that load, sometimes never got a turn's trace.
  # Those tests run on their own, one at a time.
  say "Running the browser and MLflow tests (one at a time)"
  "${PYTEST[@]}" -n 0 -m "browser or alone"
else
  "${PYTEST[@]}" "$@"
fi
if [[ -n $PG_URL ]]; then
  say "Running the store and API suites on PostgreSQL"
  FLEET_TEST_DATABASE_URL="$PG_URL" "${PYTEST[@]}" -m "not browser" tests/test_store.py tests/api
fi
