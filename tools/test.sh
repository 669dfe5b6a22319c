#!/usr/bin/env bash
# Installs the packages, builds, and runs every test suite:
#   1. ctest on build/ (unit tests and the root integration tests, label `root`)
#   2. the end-to-end suite (tests/e2e, pytest) against a real sbxd
#   2a. the escape and abuse suite (tests/security, pytest): attacks from inside real sandboxes
#   2b. bench-smoke: tools/bench.sh --quick (the benchmark suite, a few iterations each)
#   3. (CI, or SBX_TEST_ASAN=1) an ASan/UBSan build in build-asan/ running the unit tests
# Ends with one line "summary: N passed, N failed[, N skipped]" counting suites, and exits
# non-zero if any suite failed.
#
# Environment:
#   CI=true               also sets SBX_TESTS_MUST_RUN=1 (root tests fail instead of skipping)
#                         and turns the sanitizer suite on by default
#   SBX_TEST_ASAN=0|1     force the sanitizer suite off/on
#   SBX_TEST_BUDGET_S     total seconds the whole script may take (default 1800): the sanitizer
#                         build gets what is left and is skipped when it does not fit, to keep
#                         CI well under 40 minutes
#   SBX_SKIP_INSTALL=1    do not run tools/install-deps.sh
#   PYTEST_ARGS           extra arguments for pytest (e.g. "-k attach")
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
START=$(date +%s)
PY=/usr/bin/python3  # Debian's python has pytest; a pyenv python on PATH may not

if [[ "${CI:-}" == "true" ]]; then
  export SBX_TESTS_MUST_RUN=1
  : "${SBX_TEST_ASAN:=1}"
fi
: "${SBX_TEST_ASAN:=0}"
: "${SBX_TEST_BUDGET_S:=1800}"

declare -a NAMES=() RESULTS=()
record() { NAMES+=("$1"); RESULTS+=("$2"); }
elapsed() { echo $(( $(date +%s) - START )); }
banner() { printf '\n===== %s (t+%ss) =====\n' "$*" "$(elapsed)"; }

finish() {
  local passed=0 failed=0 skipped=0 i
  banner "results"
  for i in "${!NAMES[@]}"; do
    printf '  %-28s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"
    case "${RESULTS[$i]}" in
      passed) passed=$((passed + 1)) ;;
      skipped*) skipped=$((skipped + 1)) ;;
      *) failed=$((failed + 1)) ;;
    esac
  done
  echo "total time: $(elapsed)s"
  if [[ $skipped -gt 0 ]]; then
    echo "summary: $passed passed, $failed failed, $skipped skipped"
  else
    echo "summary: $passed passed, $failed failed"
  fi
  [[ $failed -eq 0 && $passed -gt 0 ]]
  exit $?
}

echo "sbx tests: $(uname -srm), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), CI=${CI:-}, SBX_TESTS_MUST_RUN=${SBX_TESTS_MUST_RUN:-0}, uid $(id -u)"

# The names of the tests a ctest run failed, on one line: they go into the results table at
# the end, which is what survives when only the tail of a long log is kept.
failed_tests() {
  local f="$1/Testing/Temporary/LastTestsFailed.log"
  [[ -s "$f" ]] || { echo "?"; return; }
  cut -d: -f2- "$f" | head -20 | tr '\n' ' '
}

# ---- packages --------------------------------------------------------------------------------
if [[ "${SBX_SKIP_INSTALL:-0}" != "1" ]]; then
  banner "install packages"
  if ! bash tools/install-deps.sh; then
    record install failed
    record build "failed (not run)"
    finish
  fi
fi

# ---- build -----------------------------------------------------------------------------------
banner "build (build/, RelWithDebInfo)"
build_start=$(date +%s)
BUILD_S=0
if bash tools/build.sh build; then
  BUILD_S=$(( $(date +%s) - build_start ))
  record build passed
else
  record build failed
  record ctest "failed (not run: no build)"
  record e2e "failed (not run: no build)"
  record security "failed (not run: no build)"
  record bench-smoke "failed (not run: no build)"
  finish
fi

# ---- ctest: unit + root integration tests ------------------------------------------------------
banner "ctest (unit + root integration)"
if ctest --test-dir build --output-on-failure -j2 --no-tests=error --timeout 600; then
  record ctest passed
else
  record ctest "failed: $(failed_tests build)"
fi

# ---- end-to-end --------------------------------------------------------------------------------
banner "e2e (pytest tests/e2e)"
export SBX_BUILD_DIR="$ROOT/build"  # the tree built above, whatever the caller had set
# shellcheck disable=SC2086
timeout -k 30 "${SBX_E2E_TIMEOUT_S:-1200}" "$PY" -m pytest tests/e2e -v ${PYTEST_ARGS:-}
rc=$?
case $rc in
  0) record e2e passed ;;
  5) echo "pytest collected no tests: that is a failure"; record e2e "failed (no tests ran)" ;;
  124|137) record e2e "failed (timed out)" ;;
  *) record e2e "failed (pytest exit $rc)" ;;
esac

# ---- escape and abuse suite ---------------------------------------------------------------------
# Every case runs one attack inside a real sandbox and checks that it failed the expected way
# and that sbxd, a bystander sandbox and the host state it aimed at are unaffected. Writes
# build/security-report.json and prints "security: N attacks tried, N contained".
banner "security (pytest tests/security)"
# shellcheck disable=SC2086
timeout -k 30 "${SBX_SECURITY_TIMEOUT_S:-600}" "$PY" -m pytest tests/security -v ${PYTEST_ARGS:-}
rc=$?
case $rc in
  0) record security passed ;;
  5) echo "pytest collected no tests: that is a failure"; record security "failed (no tests ran)" ;;
  124|137) record security "failed (timed out)" ;;
  *) record security "failed (pytest exit $rc)" ;;
esac

# ---- benchmark smoke run -----------------------------------------------------------------------
# The suite in its quick mode (a few iterations each): proves that sbx-load runs every scenario
# and peer against real daemons and that the results file and the plot are produced. It
# asserts nothing about time; it writes only under build/bench-quick/.
banner "bench-smoke (tools/bench.sh --quick)"
if SBX_SKIP_INSTALL=1 timeout -k 15 "${SBX_BENCH_TIMEOUT_S:-420}" bash tools/bench.sh --quick &&
   "$PY" bench/check_results.py "$ROOT/build/bench-quick"; then
  record bench-smoke passed
else
  record bench-smoke failed
fi

# ---- sanitizers --------------------------------------------------------------------------------
if [[ "$SBX_TEST_ASAN" == "1" ]]; then
  # The sanitizer build takes at least as long as the main one did (a slow main build means a
  # cold ccache, and then the sanitizer tree is cold too). It gets what is left of the budget,
  # minus a reserve for running the tests, and starts only if that covers 1.2x the main build;
  # a build that still does not fit is cut off and reported as skipped (ccache keeps what it
  # compiled, so the next run gets further).
  remaining=$(( SBX_TEST_BUDGET_S - $(elapsed) - 180 ))
  needed=$(( BUILD_S * 6 / 5 ))
  (( needed < 300 )) && needed=300
  if (( remaining < needed )); then
    echo "asan: skipped: ${remaining}s left in the ${SBX_TEST_BUDGET_S}s budget, a build needs ~${needed}s (main build took ${BUILD_S}s)"
    record asan-unit "skipped (time budget)"
  else
    banner "ASan/UBSan build (build-asan/, at most ${remaining}s) + unit tests (ctest -LE root)"
    timeout -k 10 "$remaining" bash tools/build.sh build-asan -DSBX_SANITIZE=ON
    rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "asan: the build did not finish within ${remaining}s; skipped"
      record asan-unit "skipped (build over time budget)"
    elif [[ $rc -ne 0 ]]; then
      record asan-unit "failed (build)"
    elif ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}" \
         UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
         ctest --test-dir build-asan --output-on-failure -j2 --no-tests=error --timeout 600 -LE root; then
      record asan-unit passed
    else
      record asan-unit "failed: $(failed_tests build-asan)"
    fi
  fi
else
  record asan-unit "skipped (SBX_TEST_ASAN=0)"
fi

finish
