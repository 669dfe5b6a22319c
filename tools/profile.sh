#!/usr/bin/env bash
# Flame graphs of sbx under load (docs/benchmarks.md, "Where the time goes"): starts its own
# sbxd (loopback, a temporary state dir, no warm pool), records every CPU with
# `perf record -e cpu-clock --call-graph dwarf -a` while one scenario runs, and turns the
# samples of that sbxd and of every process it started (holders, agents, the commands they ran),
# plus the kernel threads that work for them, into an SVG with tools/flamegraph.py.
#
# Usage (root, after tools/build.sh): bash tools/profile.sh [SCENARIO...]
#   create   N cold creates → running, one after another (`sbx create`); deleted after perf stops
#   exec     `sbx-load --scenarios exec`: session ["true"] + attach, N times in one sandbox
#   upload   PUTs of 256 MiB through the files API (curl -T), as bench/file_transfer.sh does,
#            4 of them to the same path (one lasts ~0.5 s: too few samples alone)
#   sustained `sbx-load --scenarios sustained`: create + exec + delete cycles from 8 workers
#            (not in the default set)
# Default: all three. Writes docs/flamegraphs/{create,exec,upload}.svg (SBX_PROFILE_OUT to put
# them elsewhere) and keeps the folded stacks beside them (*.folded, not tracked).
#
# Environment: SBX_BUILD_DIR (default build), SBX_PROFILE_OUT (default docs/flamegraphs),
# SBX_PROFILE_FREQ (samples/s per CPU, default 499), SBX_PROFILE_CALLGRAPH (default dwarf,16384:
# the RelWithDebInfo build omits frame pointers, so `-g` alone would lose most user frames),
# SBX_PROFILE_CREATES (default 200), SBX_PROFILE_EXECS (default 1000), SBX_PROFILE_UPLOAD_MIB
# (default 256), SBX_PROFILE_UPLOADS (default 4), SBX_PROFILE_SUSTAINED_S (default 10), SBX_PROFILE_MIN_WIDTH (px, default 0.25:
# narrower boxes are left out of the SVG), SBX_PROFILE_KTHREADS (regex of kernel threads kept in the graph; on a busy
# host they also do other processes' work, and "" leaves them out).
# sbxd, perf and every sandbox are stopped by PID (sandboxes deleted through the API first) and
# the state directory removed, also when something fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD=${SBX_BUILD_DIR:-$ROOT/build}
BIN=$BUILD/bin
OUT=${SBX_PROFILE_OUT:-$ROOT/docs/flamegraphs}
FREQ=${SBX_PROFILE_FREQ:-499}
CALLGRAPH=${SBX_PROFILE_CALLGRAPH:-dwarf,16384}
CREATES=${SBX_PROFILE_CREATES:-200}
EXECS=${SBX_PROFILE_EXECS:-1000}
UPLOAD_MIB=${SBX_PROFILE_UPLOAD_MIB:-256}
UPLOADS=${SBX_PROFILE_UPLOADS:-4}
SUSTAINED_S=${SBX_PROFILE_SUSTAINED_S:-10}
MIN_WIDTH=${SBX_PROFILE_MIN_WIDTH:-0.25}
KTHREADS=${SBX_PROFILE_KTHREADS-'^(kworker|ksoftirqd|rcu_|jbd2|loop[0-9]|kswapd)'}

log() { echo "profile: $*"; }
die() { echo "profile: ERROR: $*" >&2; exit 1; }

scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(create exec upload)
for s in "${scenarios[@]}"; do
  case "$s" in
    create|exec|upload|sustained) ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) die "unknown scenario $s (create, exec, upload, sustained)" ;;
  esac
done
[[ $(id -u) -eq 0 ]] || die "run as root (sbxd and perf -a need it)"
for b in sbxd sbx sbx-load sbx-agent; do
  [[ -x "$BIN/$b" ]] || die "$BIN/$b missing: bash tools/build.sh build"
done
if ! command -v perf >/dev/null 2>&1; then
  log "perf missing; installing the packages (linux-perf)"
  bash tools/install-deps.sh
fi
command -v curl >/dev/null 2>&1 || die "curl missing"
mkdir -p "$OUT"

WORK=$(mktemp -d /var/tmp/sbx-profile.XXXXXX)
TOKEN="profile-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SBXD_PID=""
PERF_PID=""
URL=""

stop_perf() {
  [[ -n "$PERF_PID" ]] || return 0
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" 2>/dev/null || true
  PERF_PID=""
}

delete_all() {
  [[ -n "$URL" ]] || return 0
  local ids
  ids=$(SBX_URL="$URL" SBX_TOKEN="$TOKEN" "$BIN/sbx" ls --json 2>/dev/null |
        python3 -c 'import json,sys; print(" ".join(s["id"] for s in json.load(sys.stdin)))' 2>/dev/null || true)
  if [[ -n "$ids" ]]; then
    # shellcheck disable=SC2086
    SBX_URL="$URL" SBX_TOKEN="$TOKEN" timeout 300 "$BIN/sbx" rm $ids >/dev/null || true
  fi
}

cleanup() {
  local rc=$?
  set +e
  stop_perf
  if [[ -n "$SBXD_PID" ]] && kill -0 "$SBXD_PID" 2>/dev/null; then
    delete_all
    kill -TERM "$SBXD_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$SBXD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SBXD_PID" 2>/dev/null && kill -KILL "$SBXD_PID" 2>/dev/null
    wait "$SBXD_PID" 2>/dev/null
  fi
  if grep -q " $WORK/" /proc/self/mountinfo; then
    log "WARNING: mounts remain under $WORK; leaving it in place"
  else
    rm -rf "$WORK"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# sbxd in its own session, so that a Ctrl-C reaches us first and the trap deletes its sandboxes.
# Admission is off: the create profile keeps all its sandboxes until perf has stopped.
setsid "$BIN/sbxd" --listen 127.0.0.1:0 --state-dir "$WORK/state" --admin-token "$TOKEN" \
  --warm-pool base=0 --admission false >"$WORK/sbxd.log" 2>&1 &
SBXD_PID=$!
for _ in $(seq 300); do
  URL=$(sed -n 's/^sbxd listening on \(http:\/\/[^ ]*\).*/\1/p' "$WORK/sbxd.log" | head -n1)
  [[ -n "$URL" ]] && break
  kill -0 "$SBXD_PID" 2>/dev/null || { cat "$WORK/sbxd.log" >&2; die "sbxd exited at start-up"; }
  sleep 0.1
done
[[ -n "$URL" ]] || die "sbxd did not report its address within 30 s"
export SBX_URL="$URL" SBX_TOKEN="$TOKEN"
log "sbxd pid $SBXD_PID at $URL; perf -F $FREQ --call-graph $CALLGRAPH"

# One sandbox first, untimed and unrecorded: the first create pays one-off costs (template,
# page cache) that a steady client does not see.
warm=$("$BIN/sbx" create) || die "first create failed"
"$BIN/sbx" rm "$warm" >/dev/null

# sbxd runs the agent from a memfd ("/memfd:sbx-agent (deleted)"), a file perf script cannot
# open: --buildid-mmap records each mapping's build id, and a build-id cache that holds
# build/bin/sbx-agent (the same bytes) lets it resolve the agent's frames. The cache lives in
# $WORK, not in ~/.debug.
export PERF_BUILDID_DIR="$WORK/buildid"
perf buildid-cache -a "$BIN/sbx-agent" >/dev/null 2>&1 || log "WARNING: perf buildid-cache -a sbx-agent failed: agent frames will be [unknown]"

start_perf() {  # $1 = name
  perf record -q -e cpu-clock -F "$FREQ" --call-graph "$CALLGRAPH" -a --buildid-mmap \
    -o "$WORK/$1.data" >"$WORK/$1.perf.log" 2>&1 &
  PERF_PID=$!
  sleep 1  # perf attaches to every CPU and synthesizes the existing tasks before it samples
  kill -0 "$PERF_PID" 2>/dev/null || { cat "$WORK/$1.perf.log" >&2; die "perf record exited"; }
}

render() {  # $1 = name, $2 = title, $3 = subtitle
  log "$1: perf script → $OUT/$1.svg"
  perf script -i "$WORK/$1.data" -F comm,pid,tid,cpu,time,period,event,ip,sym,dso \
    --show-task-events 2>"$WORK/$1.script.log" >"$WORK/$1.txt" ||
    { tail -n 20 "$WORK/$1.script.log" >&2; die "perf script failed"; }
  local keep=()
  [[ -n "$KTHREADS" ]] && keep=(--keep-comm "$KTHREADS")
  python3 tools/flamegraph.py --in "$WORK/$1.txt" --pid-tree "$SBXD_PID" "${keep[@]}" \
    --title "$2" --subtitle "$3" --min-width "$MIN_WIDTH" --short-names \
    --folded-out "$OUT/$1.folded" --out "$OUT/$1.svg" ||
    die "flamegraph.py: no sample of sbxd's processes in $1"
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
host="$(nproc) CPUs, $(uname -r), commit $commit, $(date -u +%Y-%m-%d), perf -F $FREQ cpu-clock --call-graph $CALLGRAPH; kernel threads: ${KTHREADS:-left out}"

for s in "${scenarios[@]}"; do
  case "$s" in
    create)
      log "create: $CREATES cold creates → running"
      start_perf create
      for _ in $(seq "$CREATES"); do "$BIN/sbx" create >/dev/null || die "create failed"; done
      stop_perf
      delete_all
      render create "sbx: $CREATES cold creates → running, one after another" "$host"
      ;;
    exec)
      log "exec: $EXECS × exec true"
      start_perf exec
      "$BIN/sbx-load" --url "$URL" --token "$TOKEN" --scenarios exec --peers none \
        --exec-n "$EXECS" >"$WORK/exec.load.log" 2>&1 ||
        { tail -n 20 "$WORK/exec.load.log" >&2; die "sbx-load exec failed"; }
      stop_perf
      render exec "sbx: $EXECS × exec true in one running sandbox (session + attach)" "$host"
      ;;
    upload)
      log "upload: $UPLOADS × PUT $UPLOAD_MIB MiB"
      head -c $((UPLOAD_MIB << 20)) /dev/urandom >"$WORK/src"
      # perf first: an agent that starts before it has no build id in its mmap events (perf
      # synthesizes them from /proc), and its frames would stay unresolved. The one create is
      # a few ms of CPU beside the seconds of the uploads.
      start_perf upload
      sid=$("$BIN/sbx" create --disk $((UPLOAD_MIB * 2 + 256))) || die "create for upload failed"
      for _ in $(seq "$UPLOADS"); do
        # The same path each time: the previous file is replaced, so the disk never fills.
        curl -sf -H "Authorization: Bearer $TOKEN" -T "$WORK/src" \
          "$URL/v1/sandboxes/$sid/files?path=/root/big.bin" >/dev/null || die "upload failed"
      done
      stop_perf
      rm -f "$WORK/src"
      "$BIN/sbx" rm "$sid" >/dev/null || true
      render upload "sbx: $UPLOADS × PUT $UPLOAD_MIB MiB through the files API (fsync + rename)" "$host"
      ;;
    sustained)
      log "sustained: create + exec + delete, 8 workers, ${SUSTAINED_S} s"
      start_perf sustained
      "$BIN/sbx-load" --url "$URL" --token "$TOKEN" --scenarios sustained --peers none \
        --sustained-s "$SUSTAINED_S" >"$WORK/sustained.load.log" 2>&1 ||
        { tail -n 20 "$WORK/sustained.load.log" >&2; die "sbx-load sustained failed"; }
      stop_perf
      render sustained "sbx: create + exec + delete cycles, 8 workers, ${SUSTAINED_S} s" "$host"
      ;;
  esac
done
log "done: $(printf '%s ' "${scenarios[@]/#/$OUT/}" | sed 's/ /.svg /g')"
