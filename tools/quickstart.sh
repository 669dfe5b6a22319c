#!/usr/bin/env bash
# Builds sbx, starts sbxd on the embedded defaults (SQLite + the ns runtime + the built-in
# `base` template) and runs a first sandbox: examples/first_sandbox.py, then the CLI.
# sbxd keeps running afterwards. Run as root, after tools/install-deps.sh.
#
# Environment: SBX_LISTEN (default 127.0.0.1:7070), SBX_STATE_DIR (default /var/lib/sbx),
# SBX_BUILD_DIR (default build).
# Exits with the example's exit code (or the CLI's, if the example passed and the CLI failed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LISTEN=${SBX_LISTEN:-127.0.0.1:7070}
STATE_DIR=${SBX_STATE_DIR:-/var/lib/sbx}
LOG="$STATE_DIR/sbxd.log"
PORT=${LISTEN##*:}
URL="http://$LISTEN"
BUILD_DIR=${SBX_BUILD_DIR:-build}
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$ROOT/$BUILD_DIR"
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=python3

die() { echo "quickstart: ERROR: $*" >&2; exit 1; }

# GET $1 with a short timeout; exit status 0 on HTTP 200. Python, because curl is not part of
# a minimal Debian install.
http_ok() {
  "$PY" - "$1" <<'PY'
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

port_pid() {
  ss -Hltnp "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2
}

[[ $(id -u) -eq 0 ]] || die "run as root: the ns runtime needs namespaces, cgroups and mounts"

bash tools/build.sh "$BUILD_DIR"
for b in sbxd sbx sbx-agent; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || die "$BUILD_DIR/bin/$b was not built"
done

mkdir -p "$STATE_DIR"
chmod 0700 "$STATE_DIR"
started=0
if http_ok "$URL/healthz"; then
  SBXD_PID=$(port_pid || true)
  echo "quickstart: reusing the sbxd already answering on $URL (pid ${SBXD_PID:-unknown})"
else
  if [[ -n "$(port_pid || true)" ]] || ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .; then
    die "port $PORT is in use by something that does not answer $URL/healthz (set SBX_LISTEN)"
  fi
  echo "quickstart: starting sbxd on $URL (state in $STATE_DIR, log in $LOG)"
  # setsid + nohup: sbxd outlives this script and the terminal.
  setsid nohup "$BUILD_DIR/bin/sbxd" --listen "$LISTEN" --state-dir "$STATE_DIR" \
    >>"$LOG" 2>&1 </dev/null &
  SBXD_PID=$!
  started=1
  for _ in $(seq 1 300); do
    http_ok "$URL/healthz" && break
    kill -0 "$SBXD_PID" 2>/dev/null || { tail -n 40 "$LOG" >&2; die "sbxd exited; its log is above"; }
    sleep 0.1
  done
  http_ok "$URL/healthz" || { tail -n 40 "$LOG" >&2; die "sbxd did not answer $URL/healthz within 30 s"; }
fi
for _ in $(seq 1 300); do
  http_ok "$URL/readyz" && break
  sleep 0.1
done
http_ok "$URL/readyz" || { tail -n 40 "$LOG" >&2; die "sbxd is not ready ($URL/readyz) after 30 s"; }

if [[ -z "${SBX_TOKEN:-}" ]]; then
  if [[ -n "${SBX_ADMIN_TOKEN:-}" && $started -eq 1 ]]; then
    SBX_TOKEN=$SBX_ADMIN_TOKEN
  else
    [[ -s "$STATE_DIR/admin-token" ]] || die "no admin token in $STATE_DIR/admin-token; set SBX_TOKEN"
    SBX_TOKEN=$(cat "$STATE_DIR/admin-token")
  fi
fi
export SBX_URL="$URL" SBX_TOKEN

echo
echo "quickstart: \$ python3 examples/first_sandbox.py"
set +e
"$PY" examples/first_sandbox.py
rc=$?
echo
echo "quickstart: \$ sbx run -- python3 -c 'print(1+1)'"
"$BUILD_DIR/bin/sbx" run -- python3 -c 'print(1+1)'
cli_rc=$?
set -e

cat <<EOF

sbxd is still running (pid ${SBXD_PID:-unknown}, log $LOG).
  stop it:        kill ${SBXD_PID:-\$(pgrep -x sbxd)}
  use the CLI:    export SBX_URL=$URL SBX_TOKEN=\$(cat $STATE_DIR/admin-token)
                  export PATH=$BUILD_DIR/bin:\$PATH
                  sbx run -- python3 -c 'print("hi")'
                  sbx create; sbx ls; sbx exec SANDBOX_ID -- uname -a
                  sbx rm SANDBOX_ID
EOF
if [[ $rc -eq 0 && $cli_rc -ne 0 ]]; then
  echo "quickstart: the example passed but 'sbx run' exited $cli_rc" >&2
  rc=$cli_rc
fi
echo "quickstart: first_sandbox.py exited $rc"
exit $rc
