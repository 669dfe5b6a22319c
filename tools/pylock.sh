# Pinned Python environments of the test suites (sourced, not run): the deploy suite's
# (tests/deploy) and schemathesis's (tools/schemathesis). Debian's python3 with venv.
#   pylock_relock DIR      regenerates DIR/requirements.lock from DIR/requirements.in
#                          (pip-compile --generate-hashes, in a scratch venv)
#   pylock_venv LOCK ROOT  prints a venv's path with LOCK installed (--require-hashes, --no-deps,
#                          `pip check`ed), made once under ROOT per interpreter version and lock
#                          content; a marker written last makes an interrupted install redone

PYLOCK_PY=/usr/bin/python3

pylock_relock() {
  local dir=$1 scratch
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/sbx-relock.XXXXXX")
  "$PYLOCK_PY" -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q pip-tools
  (cd "$dir" && "$scratch/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --strip-extras \
     --no-emit-index-url --no-emit-find-links --rebuild -o requirements.lock requirements.in)
  local rc=$?
  rm -rf "$scratch"
  return $rc
}

pylock_venv() {
  local lock=$1 root=$2 pyver venv
  pyver=$("$PYLOCK_PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  venv="$root/py-$(printf '%s' "$pyver" | cat - "$lock" | sha256sum | cut -c1-16)"
  if [[ ! -f "$venv/.complete" ]]; then
    rm -rf "$venv"
    mkdir -p "$root"
    "$PYLOCK_PY" -m venv "$venv" >&2 &&
      "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock" >&2 &&
      "$venv/bin/pip" check >&2 &&
      touch "$venv/.complete" || return 1
  fi
  echo "$venv"
}
