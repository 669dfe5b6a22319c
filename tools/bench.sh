#!/usr/bin/env bash
# Runs the benchmark suite (docs/benchmarks.md): installs the packages, builds, starts two
# sbxd on free loopback ports (the first without a warm pool, the second with one),
# runs build/bin/sbx-load against them with every peer required (and the CPU time and syscalls
# per operation of the first sbxd, its --sbxd-pid), then bench/file_transfer.sh, and renders
# the results; ends with a table of the repeatable forms (CPU ms, syscalls per operation).
#
# Usage (as root, from anywhere):
#   bash tools/bench.sh            standard suite: writes bench/results/{latest,file_transfer}.json,
#                                  bench/results/latency.png, the tables in docs/benchmarks.md
#                                  and the "last measured" block of SPECIFICATION.md (file
#                                  transfer of 256 MiB, ~1 minute)
#   bash tools/bench.sh --quick    a few iterations of each (what CI runs; file transfer of
#                                  16 MiB): writes build/bench-quick/{latest.json,
#                                  file_transfer.json,latency.png,benchmarks-tables.md,
#                                  specification-table.md} and never touches the tracked tree
#   bash tools/bench.sh [--quick] -- ARGS...   extra sbx-load flags (e.g. --scenarios exec)
# Both forms end with bench/e2b_create_run.py (the E2B SDK's create + first command against sbx's
# own API, its own sbxd; 20 rounds, --quick 3) in the venv of tools/e2b/sdk-env.sh:
# e2b_create_run.json beside the other results.
#
# Environment: SBX_SKIP_INSTALL=1 skips tools/install-deps.sh; SBX_BENCH_WARM_POOL (default
# base=64, enough for the 50-create burst) is the warm sbxd's --warm-pool value.
# Both daemons are stopped by PID, after their sandboxes are deleted, and their state
# directories removed, also when something fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

quick=0
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "bench: $*"; }

if [[ "${SBX_SKIP_INSTALL:-0}" != "1" ]]; then
  bash tools/install-deps.sh
fi
bash tools/build.sh build

if [[ $quick -eq 1 ]]; then
  OUT_DIR="$ROOT/build/bench-quick"
  mkdir -p "$OUT_DIR"
  JSON="$OUT_DIR/latest.json"
  PNG="$OUT_DIR/latency.png"
  MICRO="$OUT_DIR/micro.json"
  MICRO_ARGS=(--benchmark_min_time=0.01)
  REPORT_ARGS=(--tables-out "$OUT_DIR/benchmarks-tables.md"
               --spec-out "$OUT_DIR/specification-table.md")
  LOAD_MODE=(--quick)
  FT_MIB=16
  E2B_MODE=(--quick)
else
  OUT_DIR="$ROOT/bench/results"
  mkdir -p "$OUT_DIR"
  JSON="$OUT_DIR/latest.json"
  PNG="$OUT_DIR/latency.png"
  MICRO="$OUT_DIR/micro.json"
  MICRO_ARGS=()
  REPORT_ARGS=(--docs "$ROOT/docs/benchmarks.md" --spec "$ROOT/SPECIFICATION.md")
  LOAD_MODE=()
  FT_MIB=256
  E2B_MODE=()
fi
FT_JSON="$OUT_DIR/file_transfer.json"
E2B_JSON="$OUT_DIR/e2b_create_run.json"
rm -f "$JSON" "$PNG" "$FT_JSON" "$E2B_JSON"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench.XXXXXX")
TOKEN="bench-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
declare -a PIDS=() URLS=()

stop_daemon() {  # $1 = index
  local pid=${PIDS[$1]:-} url=${URLS[$1]:-} ids i
  [[ -n "$pid" ]] || return 0
  if [[ -n "$url" ]] && kill -0 "$pid" 2>/dev/null; then
    # Whatever a failed scenario left behind: delete it through the API, so every kernel
    # object is released by sbxd itself before it stops.
    ids=$(SBX_URL="$url" SBX_TOKEN="$TOKEN" build/bin/sbx ls --json 2>/dev/null |
          python3 -c 'import json,sys; print(" ".join(s["id"] for s in json.load(sys.stdin)))' 2>/dev/null || true)
    if [[ -n "$ids" ]]; then
      log "deleting leftover sandboxes on $url: $ids"
      # shellcheck disable=SC2086
      SBX_URL="$url" SBX_TOKEN="$TOKEN" timeout 120 build/bin/sbx rm $ids >/dev/null || true
    fi
  fi
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "sbxd $pid did not stop within 10 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  PIDS[$1]=""
}

cleanup() {
  local rc=$?
  set +e
  local i
  for i in "${!PIDS[@]}"; do stop_daemon "$i"; done
  if grep -q " ${WORK}/" /proc/self/mountinfo; then
    log "WARNING: mounts remain under $WORK; leaving it in place"
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_daemon() {  # $1 = name, rest = extra sbxd flags; sets PIDS/URLS
  local name=$1 i url=""
  shift
  # In its own session: a timeout or Ctrl-C signals our whole process group, and sbxd must
  # outlive that long enough for the trap to delete its sandboxes through the API.
  setsid build/bin/sbxd --listen 127.0.0.1:0 --state-dir "$WORK/$name" --admin-token "$TOKEN" \
    "$@" >"$WORK/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  URLS+=("")
  for i in $(seq 1 300); do
    url=$(sed -n 's/^sbxd listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/$name.log" | head -n1)
    [[ -n "$url" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "bench: sbxd ($name) exited at start-up; its log:" >&2
      cat "$WORK/$name.log" >&2
      return 1
    fi
    sleep 0.1
  done
  if [[ -z "$url" ]]; then
    echo "bench: sbxd ($name) did not report its address within 30 s; its log:" >&2
    tail -n 40 "$WORK/$name.log" >&2
    return 1
  fi
  URLS[${#URLS[@]}-1]=$url
  log "sbxd ($name) pid $pid at $url"
}

# The main sbxd has no warm pool, so every scenario but create_warm measures a cold launch.
# Admission is off: density packs 5,000 idle sandboxes of 512 MiB (and 64 pool members) to measure
# what one costs, far beyond what a host may promise sandboxes that use their limits.
start_daemon main --warm-pool base=0 --admission false
MAIN_PID=${PIDS[0]}
MAIN_URL=${URLS[0]}
start_daemon warm --warm-pool "${SBX_BENCH_WARM_POOL:-base=64}" --admission false
WARM_URL=${URLS[1]}

log "running sbx-load${LOAD_MODE[*]:+ ${LOAD_MODE[*]}} (results: $JSON)"
rc=0
build/bin/sbx-load --url "$MAIN_URL" --token "$TOKEN" --warm-url "$WARM_URL" \
  --sbxd-pid "$MAIN_PID" --require-peers --out "$JSON" "${LOAD_MODE[@]}" "${extra[@]}" || rc=$?
if [[ ! -s "$JSON" ]]; then
  echo "bench: sbx-load wrote no results (exit $rc)" >&2
  exit 1
fi
# Hot-path micro-benchmarks (Google Benchmark), after the load so they do not share the CPU.
log "running sbx-micro-bench (results: $MICRO)"
if ! build/bin/sbx-micro-bench --benchmark_out="$MICRO" --benchmark_out_format=json \
    "${MICRO_ARGS[@]}" > "$WORK/micro.txt" 2>&1; then
  echo "bench: sbx-micro-bench failed; its output:" >&2
  tail -n 30 "$WORK/micro.txt" >&2
  exit 1
fi
# A user namespace's making against the size of sbxd's descriptor table (density, issue 15).
USERNS_N=200
[[ $quick -eq 1 ]] && USERNS_N=20
log "running sbx-userns-cost --owned --fds 0,5000 --n $USERNS_N"
if ! build/bin/sbx-userns-cost --owned --fds 0,5000 --n "$USERNS_N" > "$WORK/userns.txt" 2>&1; then
  echo "bench: sbx-userns-cost failed; its output:" >&2
  tail -n 30 "$WORK/userns.txt" >&2
  exit 1
fi
cat "$WORK/userns.txt"
# File transfer through the files API against bwrap (its own sbxd; ~1 minute with 256 MiB).
log "running bench/file_transfer.sh $FT_MIB (results: $FT_JSON)"
if ! bash bench/file_transfer.sh "$FT_MIB" --json "$FT_JSON" > "$WORK/file_transfer.txt" 2>&1; then
  echo "bench: bench/file_transfer.sh failed; its output:" >&2
  tail -n 30 "$WORK/file_transfer.txt" >&2
  exit 1
fi
cat "$WORK/file_transfer.txt"
# The E2B compatibility layer's cost: the official Python SDK against sbx's own API (its own sbxd).
log "running bench/e2b_create_run.py${E2B_MODE[*]:+ ${E2B_MODE[*]}} (results: $E2B_JSON)"
if ! bash tools/e2b/sdk-env.sh --env-file "$WORK/e2b-env.sh" > "$WORK/e2b-env.txt" 2>&1; then
  echo "bench: tools/e2b/sdk-env.sh failed; its output:" >&2
  tail -n 30 "$WORK/e2b-env.txt" >&2
  exit 1
fi
# shellcheck disable=SC1091
SBX_TEST_E2B_PYTHON=$(source "$WORK/e2b-env.sh"; echo "$SBX_TEST_E2B_PYTHON")
"$SBX_TEST_E2B_PYTHON" bench/e2b_create_run.py "${E2B_MODE[@]}" --build "$ROOT/build" --json "$E2B_JSON"
python3 bench/report.py --in "$JSON" --micro "$MICRO" --png "$PNG" --file-transfer "$FT_JSON" \
  "${REPORT_ARGS[@]}"
# The figures a loaded host does not skew, in one table at the end of the log.
python3 bench/report.py --in "$JSON" --file-transfer "$FT_JSON" --print-repeatable
if [[ $rc -ne 0 ]]; then
  echo "bench: sbx-load exited $rc: some scenario or peer could not run (see above)" >&2
  exit "$rc"
fi
log "done: $JSON, $PNG"
