# Sourced by the scripts here: the progress lines, timed steps and the checks of their --check mode.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLEET_VENV:-$ROOT/.venv}  # the virtual environment to install into and run from
PY=$VENV/bin/python

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# step TITLE COMMAND...: say TITLE, run COMMAND, then say how long it took (a failure still stops the script).
step() {
  local title=$1 started=$SECONDS
  shift
  say "$title"
  "$@"
  printf '    done in %s s\n' "$((SECONDS - started))"
}

# check WHAT COMMAND...: in a --check run, run COMMAND quietly and report WHAT as ok or FAILED (with why).
check_failures=0
check() {
  local what=$1 out
  shift
  if out=$("$@" 2>&1); then
    printf '  ok      %s\n' "$what"
  else
    printf '  FAILED  %s: `%s`\n' "$what" "$*"
    [[ -n $out ]] && printf '%s\n' "$out" | tail -5 | sed 's/^/          /'
    check_failures=$((check_failures + 1))
  fi
}

# note TEXT: a line of a --check run that is information, not a failure.
note() { printf '  note    %s\n' "$*"; }

# check_done NAME: end a --check run: exit 0 when every check passed, else 1.
check_done() {
  if ((check_failures)); then
    printf '%s --check: %s check(s) failed\n' "$1" "$check_failures" >&2
    exit 1
  fi
  printf '%s --check: all checks passed\n' "$1"
  exit 0
}

# has_package PKG: the Debian package is installed.
has_package() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
