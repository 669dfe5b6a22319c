#!/usr/bin/env bash
# Prepares schemathesis (the property-based API tester) for tests/e2e/test_openapi_fuzz.py,
# once per content: a venv with tools/schemathesis/requirements.lock (every package pinned with
# --hash, installed with --require-hashes), cached under a key of the lock's hash and the
# interpreter's version, so a rerun costs nothing. Prints the path of its `st` command last.
#
# Usage: bash tools/schemathesis/env.sh [--relock]
#   --relock  regenerates requirements.lock from requirements.in (pip-compile, in a scratch venv)
# Environment: SBX_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/sbx): the venv goes to
# $SBX_CACHE_DIR/schemathesis/. Needs Debian's python3-venv (installed when missing, as root).
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE="${SBX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx}/schemathesis"

log() { echo "schemathesis-env: $*" >&2; }

if ! /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  [[ $(id -u) -eq 0 ]] || { log "python3-venv is missing: apt-get install python3-venv"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >&2
fi

# shellcheck source=tools/pylock.sh
source "$DIR/../pylock.sh"
if [[ ${1:-} == --relock ]]; then
  pylock_relock "$DIR"
  exit
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--relock]" >&2; exit 2; }

log "venv of $(grep -m1 '^schemathesis==' "$DIR/requirements.lock" | cut -d' ' -f1) under $CACHE"
venv=$(pylock_venv "$DIR/requirements.lock" "$CACHE")
echo "$venv/bin/st"
