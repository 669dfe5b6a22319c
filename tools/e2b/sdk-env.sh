#!/usr/bin/env bash
# Prepares the official E2B SDKs the e2b suites run (tests/e2b, issue 19), once per content:
#   pinned (default): a venv with tests/e2b/python/requirements.lock (e2b 2.21.1,
#     e2b-code-interpreter 2.6.2, pytest; every package pinned with --hash, installed with
#     --require-hashes) and node_modules from tests/e2b/node/package-lock.json (e2b 2.51.0,
#     @e2b/code-interpreter; `npm ci`). Cached under a key of the lock files' hash and the
#     interpreter's version, so a rerun costs nothing.
#   --newest: the newest releases of Python e2b and e2b-code-interpreter and npm e2b and
#     @e2b/code-interpreter (the drift suite), keyed by the versions the registries name today:
#     installed once per release.
# Prints the versions it installed, then (last lines, for eval or an env file):
#   SBX_TEST_E2B_PYTHON=<venv>/bin/python  SBX_TEST_E2B_NODE_MODULES=<dir>/node_modules  SBX_TEST_E2B_VERSIONS=...
#
# Usage: bash tools/e2b/sdk-env.sh [--newest] [--env-file FILE] [--relock]
#   --env-file FILE  also writes those assignments to FILE
#   --relock         regenerates requirements.lock (pip-compile --generate-hashes, in a scratch
#                    venv) and package-lock.json from requirements.in / package.json, then exits
# Environment: SBX_CACHE_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/sbx): the cache's root; the
# SDKs go to $SBX_CACHE_DIR/e2b/. Needs python3 with venv (Debian python3-venv) and node >= 20
# with npm (installed from Debian's packages when missing).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY_DIR="$ROOT/tests/e2b/python"
NODE_DIR="$ROOT/tests/e2b/node"
BASE_PY=/usr/bin/python3  # Debian's: the interpreter every other suite runs under
CACHE="${SBX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sbx}/e2b"

newest=0 relock=0 env_file=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --newest) newest=1; shift ;;
    --relock) relock=1; shift ;;
    --env-file) env_file=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "sdk-env: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "sdk-env: $*" >&2; }
die() { echo "sdk-env: ERROR: $*" >&2; exit 1; }
sha() { cat "$@" | sha256sum | cut -c1-16; }

ensure_tools() {
  local need=()
  "$BASE_PY" -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
  if [[ ${#need[@]} -gt 0 ]]; then
    [[ $(id -u) -eq 0 ]] || die "missing ${need[*]}: install them (as root: apt-get install ${need[*]})"
    log "installing ${need[*]} (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 ||
      { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; }
  fi
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  (( major >= 20 )) || die "node $(node --version) is too old: the node tests need >= 20 (node --test's junit reporter, the SDK's fetch)"
}

if [[ $relock -eq 1 ]]; then
  ensure_tools
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/sbx-relock.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  "$BASE_PY" -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q pip-tools
  (cd "$PY_DIR" && "$scratch/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
     --no-emit-index-url --rebuild -o requirements.lock requirements.in)
  (cd "$NODE_DIR" && rm -f package-lock.json && npm install --package-lock-only --ignore-scripts --no-audit --no-fund >&2)
  log "rewrote $PY_DIR/requirements.lock and $NODE_DIR/package-lock.json"
  exit 0
fi

ensure_tools
mkdir -p "$CACHE"
pyver=$("$BASE_PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')

# A directory is complete only once its marker exists: an interrupted install is redone.
fresh_dir() {  # $1 = dir: removes a half-made one; returns 0 if it must be (re)built
  [[ -f "$1/.complete" ]] && return 1
  rm -rf "$1"
  mkdir -p "$1"
  return 0
}

if [[ $newest -eq 0 ]]; then
  PY_ENV="$CACHE/py-$(printf '%s' "$pyver" | cat - "$PY_DIR/requirements.lock" | sha256sum | cut -c1-16)"
  if fresh_dir "$PY_ENV"; then
    log "creating $PY_ENV from requirements.lock"
    "$BASE_PY" -m venv "$PY_ENV"
    "$PY_ENV/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
      -r "$PY_DIR/requirements.lock" >&2
    "$PY_ENV/bin/pip" check >&2
    touch "$PY_ENV/.complete"
  fi
  NODE_ENV="$CACHE/node-$(sha "$NODE_DIR/package.json" "$NODE_DIR/package-lock.json")"
  if fresh_dir "$NODE_ENV"; then
    log "installing $NODE_ENV from package-lock.json (npm ci)"
    cp "$NODE_DIR/package.json" "$NODE_DIR/package-lock.json" "$NODE_ENV/"
    (cd "$NODE_ENV" && npm ci --ignore-scripts --no-audit --no-fund >&2)
    touch "$NODE_ENV/.complete"
  fi
else
  # The versions the registries call newest today (the drift suite's point: a release that
  # breaks the SDKs against sbx shows the day it appears).
  py_latest() {
    "$BASE_PY" -m pip index versions "$1" --disable-pip-version-check 2>/dev/null |
      sed -n "1s/^$1 (\(.*\))$/\1/p"
  }
  e2b_py=$(py_latest e2b) ci_py=$(py_latest e2b-code-interpreter)
  [[ -n "$e2b_py" && -n "$ci_py" ]] || die "could not ask PyPI for the newest e2b / e2b-code-interpreter"
  e2b_js=$(npm view e2b@latest version 2>/dev/null) ci_js=$(npm view @e2b/code-interpreter@latest version 2>/dev/null)
  [[ -n "$e2b_js" && -n "$ci_js" ]] || die "could not ask npm for the newest e2b / @e2b/code-interpreter"
  PY_ENV="$CACHE/py-newest-$pyver-e2b-$e2b_py-ci-$ci_py"
  if fresh_dir "$PY_ENV"; then
    log "creating $PY_ENV (newest: e2b $e2b_py, e2b-code-interpreter $ci_py)"
    "$BASE_PY" -m venv "$PY_ENV"
    # The SDKs at their newest; what the suite itself needs (pytest and tests/e2e's imports)
    # where requirements.in leaves them.
    grep -vE '^\s*(#|$|e2b)' "$PY_DIR/requirements.in" > "$PY_ENV/runner.in"
    "$PY_ENV/bin/pip" install -q --disable-pip-version-check "e2b==$e2b_py" \
      "e2b-code-interpreter==$ci_py" -r "$PY_ENV/runner.in" >&2
    touch "$PY_ENV/.complete"
  fi
  NODE_ENV="$CACHE/node-newest-e2b-$e2b_js-ci-$ci_js"
  if fresh_dir "$NODE_ENV"; then
    log "installing $NODE_ENV (newest: e2b $e2b_js, @e2b/code-interpreter $ci_js)"
    "$BASE_PY" - "$NODE_DIR/package.json" "$NODE_ENV/package.json" "$e2b_js" "$ci_js" <<'EOF'
import json, sys
pkg = json.load(open(sys.argv[1]))
pkg["dependencies"] = {"e2b": sys.argv[3], "@e2b/code-interpreter": sys.argv[4]}
json.dump(pkg, open(sys.argv[2], "w"), indent=2)
EOF
    (cd "$NODE_ENV" && npm install --ignore-scripts --no-audit --no-fund >&2)
    touch "$NODE_ENV/.complete"
  fi
fi

# What was really installed (a dependency range can pull a different e2b under the
# code interpreter than the one asked for).
py_versions=$("$PY_ENV/bin/python" - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("e2b", "e2b-code-interpreter", "pytest")))
EOF
)
js_versions=$(cd "$NODE_ENV" && node -e '
const v = (p) => require(p + "/package.json").version;
const ci = require.resolve("@e2b/code-interpreter/package.json");
const ciE2b = require(require.resolve("e2b/package.json", {paths: [require("path").dirname(ci)]})).version;
console.log(`e2b@${v("e2b")} @e2b/code-interpreter@${v("@e2b/code-interpreter")} (its e2b: ${ciE2b}) node@${process.versions.node}`);')
log "python ($PY_ENV): $py_versions"
log "node   ($NODE_ENV): $js_versions"

versions="python: $py_versions; node: $js_versions"
out=$(cat <<EOF
SBX_TEST_E2B_PYTHON=$PY_ENV/bin/python
SBX_TEST_E2B_NODE_MODULES=$NODE_ENV/node_modules
SBX_TEST_E2B_VERSIONS='$versions'
EOF
)
echo "$out"
[[ -z "$env_file" ]] || echo "$out" > "$env_file"
