#!/usr/bin/env bash
# Tests of tools/test_lib.sh (the bookkeeping of tools/test.sh) with fake suites: JUnit
# reports written here, a real pytest run and a real ctest run of tests that only skip, and
# fake builds that exit, fail, overrun their budget or are SIGKILLed. ctest runs it as
# test_sh_lib_test; it takes a few seconds and starts nothing that outlives it.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-/usr/bin/python3}
[[ -x "$PY" ]] || PY=$(command -v python3)
START=$(date +%s)
# shellcheck source=tools/test_lib.sh
source "$ROOT/tools/test_lib.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sbx-test-lib.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FAILS=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
expect_eq() {  # what got want
  if [[ "$2" == "$3" ]]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi
}
expect_prefix() {
  if [[ "$2" == "$3"* ]]; then ok "$1"; else bad "$1: got '$2', want it to start with '$3'"; fi
}

junit() {  # junit FILE PASSED FAILED SKIPPED (pytest's dialect)
  local f=$1 i
  {
    echo '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
    for ((i = 0; i < $2; i++)); do echo "<testcase classname=\"t\" name=\"p$i\"/>"; done
    for ((i = 0; i < $3; i++)); do echo "<testcase classname=\"t\" name=\"f$i\"><failure message=\"x\"/></testcase>"; done
    for ((i = 0; i < $4; i++)); do echo "<testcase classname=\"t\" name=\"s$i\"><skipped message=\"x\"/></testcase>"; done
    echo '</testsuite></testsuites>'
  } >"$f"
}

# Runs `judge` for one fake suite in a fresh table and prints "RESULT|COUNTS".
judged() {  # judged CI RESULT REPORT [NOTE]
  (
    NAMES=() RESULTS=() COUNTS=() WALL=()
    CI=$1
    suite_start
    judge fake "$2" "$3" "${4:-}"
    echo "${RESULTS[0]}|${COUNTS[0]}"
  )
}

# ---- judge -------------------------------------------------------------------------------------
junit "$TMP/some.xml" 2 0 1
expect_eq "tests ran, some skipped: passed" "$(judged true "" "$TMP/some.xml")" "passed|2 0 1"
expect_eq "the note follows passed" "$(judged true "" "$TMP/some.xml" "3 attacks tried")" \
  "passed (3 attacks tried)|2 0 1"
junit "$TMP/allskip.xml" 0 0 4
expect_prefix "all skipped under CI: failed" "$(judged true "" "$TMP/allskip.xml")" "failed (nothing ran: 4 skipped"
expect_prefix "all skipped elsewhere: skipped, not passed" "$(judged "" "" "$TMP/allskip.xml")" "skipped (nothing ran: 4 skipped"
junit "$TMP/none.xml" 0 0 0
expect_prefix "no test at all under CI: failed" "$(judged true "" "$TMP/none.xml")" "failed (nothing ran"
expect_prefix "exit 0 without a report: failed" "$(judged true "" "$TMP/missing.xml")" "failed (no test report"
junit "$TMP/fails.xml" 5 1 0
expect_eq "a failing exit keeps its text and shows the counts" \
  "$(judged true "failed: a b" "$TMP/fails.xml")" "failed: a b|5 1 0"
expect_prefix "exit 0 but failures in the report: failed" "$(judged "" "" "$TMP/fails.xml")" "failed (1 failed in"
echo 'not xml' >"$TMP/broken.xml"
expect_prefix "an unreadable report: failed" "$(judged "" "" "$TMP/broken.xml")" "failed (no test report"

# ---- a real pytest suite whose tests all skip ----------------------------------------------------
mkdir -p "$TMP/py"
cat >"$TMP/py/test_fake.py" <<'EOF'
import pytest


def test_needs_root():
    pytest.skip("fake suite: nothing can run here")
EOF
if "$PY" -m pytest --version >/dev/null 2>&1; then
  (cd "$TMP/py" && "$PY" -m pytest -q -p no:cacheprovider test_fake.py --junitxml="$TMP/py.xml" >/dev/null 2>&1)
  rc=$?
  expect_eq "pytest exits 0 when every test skips" "$rc" "0"
  expect_prefix "...which under CI is a failure" "$(judged true "$(pytest_result $rc)" "$TMP/py.xml")" \
    "failed (nothing ran: 1 skipped"
else
  bad "no pytest for $PY (tools/install-deps.sh installs python3-pytest)"
fi
expect_prefix "pytest exit 5 (nothing collected)" "$(pytest_result 5)" "failed (no tests ran"
expect_eq "pytest exit 124" "$(pytest_result 124)" "failed (timed out)"
expect_prefix "pytest exit 137" "$(pytest_result 137)" "failed (killed"

# ---- a real ctest suite whose tests all skip, and one with a test that cannot run ---------------
if command -v cmake >/dev/null && command -v ctest >/dev/null; then
  mkdir -p "$TMP/ct"
  cat >"$TMP/ct/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(fake NONE)
enable_testing()
add_test(NAME gtest_style_skip COMMAND sh -c "echo '[  SKIPPED ] needs root'")
set_tests_properties(gtest_style_skip PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
add_test(NAME code_skip COMMAND sh -c "exit 77")
set_tests_properties(code_skip PROPERTIES SKIP_RETURN_CODE 77)
EOF
  if cmake -S "$TMP/ct" -B "$TMP/ct/b" >/dev/null 2>&1; then
    ctest --test-dir "$TMP/ct/b" --output-junit "$TMP/ct.xml" >/dev/null 2>&1
    rc=$?
    expect_eq "ctest exits 0 when every test skips" "$rc" "0"
    expect_prefix "...which under CI is a failure" "$(judged true "" "$TMP/ct.xml")" "failed (nothing ran: 2 skipped"
    echo 'add_test(NAME missing_binary COMMAND /nonexistent/sbx-test-binary)' >>"$TMP/ct/CMakeLists.txt"
    cmake -S "$TMP/ct" -B "$TMP/ct/b" >/dev/null 2>&1
    ctest --test-dir "$TMP/ct/b" --output-junit "$TMP/ct2.xml" >/dev/null 2>&1
    expect_eq "ctest's Not Run counts as failed, not skipped" "$(junit_counts "$TMP/ct2.xml")" "0 1 2"
  else
    bad "cmake could not configure the fake ctest project"
  fi
else
  bad "no cmake/ctest"
fi

# ---- the security suite's attack count ---------------------------------------------------------
echo '{"tried": 3, "contained": 3}' >"$TMP/sec.json"
echo '{"tried": 0, "contained": 0}' >"$TMP/sec0.json"
expect_eq "attacks tried from the report" "$(attacks_tried "$TMP/sec.json")" "3"
expect_eq "no report: 0 attacks" "$(attacks_tried "$TMP/nope.json")" "0"
expect_eq "attacks tried: the exit status stands" "$(CI=true attacks_verdict "" 3)" ""
expect_prefix "0 attacks under CI: failed" "$(CI=true attacks_verdict "" "$(attacks_tried "$TMP/sec0.json")")" \
  "failed (no attack tried"
expect_prefix "0 attacks elsewhere: skipped" "$(CI="" attacks_verdict "" 0)" "skipped (no attack tried"
expect_eq "a failing suite keeps its text" "$(CI=true attacks_verdict "failed (pytest exit 1)" 0)" \
  "failed (pytest exit 1)"

# ---- the budgeted (ASan) build: over budget vs killed ----------------------------------------------
budget() {  # budget SECONDS CMD... -> "OUTCOME RC"
  run_budgeted "$@" >/dev/null 2>&1
  echo "$BUDGET_OUTCOME $BUDGET_RC"
}
expect_eq "a build that succeeds" "$(budget 20 true)" "ok 0"
expect_eq "a build that fails" "$(budget 20 sh -c 'exit 3')" "failed 3"
expect_eq "SIGKILLed before the budget (the OOM killer): killed, not over budget" \
  "$(budget 20 sh -c 'kill -9 $$')" "killed 137"
expect_eq "over the budget (TERM, exit 124)" "$(budget 1 sleep 30)" "over-budget 124"
expect_eq "over the budget and deaf to TERM (timeout's KILL, exit 137)" \
  "$(SBX_TEST_KILL_GRACE_S=1 budget 1 sh -c 'trap "" TERM; sleep 30 & wait; sleep 30')" "over-budget 137"

# ---- the final tables --------------------------------------------------------------------------
out=$(
  NAMES=() RESULTS=() COUNTS=() WALL=()
  CI=true
  suite_start; record lint-tests passed
  record build "failed (not run)"
  suite_start; judge ctest "" "$TMP/some.xml"
  suite_start; judge e2e "" "$TMP/allskip.xml"
  record asan-unit "skipped (SBX_TEST_ASAN=0)"
  finish
)
rc=$?
expect_eq "finish exits non-zero when a suite failed" "$rc" "1"
expect_eq "the summary line keeps its format" "$(tail -1 <<<"$out")" "summary: 2 passed, 2 failed, 1 skipped"
if grep -Eq '^  ctest +2 +0 +1  passed$' <<<"$out"; then ok "counts in the results table"; else bad "no counts row for ctest in: $out"; fi
if grep -q 'time per suite' <<<"$out" && grep -Eq '^  build +-$' <<<"$out" && grep -Eq '^  ctest +[0-9]+$' <<<"$out"; then
  ok "the time table"
else
  bad "no time table in: $out"
fi
out=$(NAMES=() RESULTS=() COUNTS=() WALL=(); record a passed; record b "passed (3 attacks tried)"; finish)
expect_eq "passed with a note counts as passed" "$?|$(tail -1 <<<"$out")" "0|summary: 2 passed, 0 failed"

out=$(
  NAMES=() RESULTS=() COUNTS=() WALL=()
  RESULTS_DIR="$TMP/results"; mkdir -p "$RESULTS_DIR"
  junit "$RESULTS_DIR/e2e.xml" 1 1 0; junit "$RESULTS_DIR/soak.xml" 0 1 0
  record e2e "failed (pytest exit 1)" "1 1 0"; record soak passed; finish
)
if grep -A2 '^===== why the failed suites failed' <<<"$out" | tr '\n' '|' | grep -q '|  e2e:|    t::f0: x|$'; then
  ok "a failed suite's failures are quoted before the table, a passed one's are not"
else
  bad "no failure reasons (or soak's too) in: $out"
fi

# ---- the drift suite: reported, never failing -----------------------------------------------------
expect_eq "drift: all passed" "$(drift_verdict 0 "$TMP/some.xml" "e2b 9.9")" "passed (e2b 9.9)"
expect_eq "drift: failures name the tests" "$(drift_verdict 1 "$TMP/fails.xml" "e2b 9.9")" \
  "drift (1 failed with e2b 9.9: f0)"
expect_prefix "drift: no report" "$(drift_verdict 2 "$TMP/missing.xml" "e2b 9.9")" "drift (no test report"
expect_prefix "drift: nothing ran" "$(drift_verdict 0 "$TMP/allskip.xml" "e2b 9.9")" "drift (pytest exit 0, 0 passed"
out=$(NAMES=() RESULTS=() COUNTS=() WALL=(); record a passed; record e2b-drift "drift (1 failed with x: t)"; finish)
rc=$?
expect_eq "a drift row fails nothing" "$rc|$(tail -1 <<<"$out")" "0|summary: 1 passed, 0 failed"
if grep -q '^drift: e2b-drift ' <<<"$out"; then ok "the drift line"; else bad "no drift line in: $out"; fi

if [[ $FAILS -gt 0 ]]; then
  echo "test_lib_test: $FAILS failed"
  exit 1
fi
echo "test_lib_test: all passed"
