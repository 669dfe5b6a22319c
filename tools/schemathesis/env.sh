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
BASE_PY=/usr/bin/python3
CACHE="${SBX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx}/schemathesis"

log() { echo "schemathesis-env: $*" >&2; }

if ! "$BASE_PY" -c 'import venv, ensurepip' 2>/dev/null; then
  [[ $(id -u) -eq 0 ]] || { log "python3-venv is missing: apt-get install python3-venv"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >&2
fi

if [[ ${1:-} == --relock ]]; then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/sbx-relock.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  "$BASE_PY" -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q pip-tools
  (cd "$DIR" && "$scratch/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
     --no-emit-index-url --no-emit-find-links --rebuild -o requirements.lock requirements.in)
  exit 0
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--relock]" >&2; exit 2; }

pyver=$("$BASE_PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
venv="$CACHE/py-$(printf '%s' "$pyver" | cat - "$DIR/requirements.lock" | sha256sum | cut -c1-16)"
if [[ ! -f "$venv/.complete" ]]; then  # the marker comes last: an interrupted install is redone
  log "installing $(grep -m1 '^schemathesis==' "$DIR/requirements.lock" | cut -d' ' -f1) into $venv"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$BASE_PY" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
    -r "$DIR/requirements.lock" >&2
  "$venv/bin/pip" check >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/st"
