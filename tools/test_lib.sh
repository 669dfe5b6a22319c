# The bookkeeping of tools/test.sh, sourced by it: one row per suite with its result, how many
# tests really ran (from a JUnit report, not from the exit status alone) and its wall time.
# tools/test_lib_test.sh drives these functions with fake suites (ctest runs it).
#
# Needs: $ROOT (the repository), $PY (a python3), $START (the script's start, date +%s),
# $RESULTS_DIR (where the suites write their JUnit reports, NAME.xml: finish quotes failures).
# Under CI=true a suite that ran nothing (no test, or every test skipped) fails; elsewhere it
# shows as skipped, never as passed.

declare -a NAMES=() RESULTS=() COUNTS=() WALL=()
SUITE_T0=""

is_ci() { [[ "${CI:-}" == "true" ]]; }
elapsed() { echo $(( $(date +%s) - START )); }
banner() { printf '\n===== %s (t+%ss) =====\n' "$*" "$(elapsed)"; }

# Marks the start of the suite that the next record() closes (its wall time).
suite_start() { SUITE_T0=$(date +%s); }

# record NAME RESULT [COUNTS]: RESULT starts with passed, skipped or failed; COUNTS is
# "P F S" (tests passed, failed, skipped) or "-" when the suite has no tests to count.
record() {
  NAMES+=("$1")
  RESULTS+=("$2")
  COUNTS+=("${3:--}")
  if [[ -n "$SUITE_T0" ]]; then
    WALL+=("$(( $(date +%s) - SUITE_T0 ))")
  else
    WALL+=("-")  # not run
  fi
  SUITE_T0=""
}

# "P F S" from a JUnit report (tools/junit_counts.py), or nothing when it cannot be read.
junit_counts() {
  [[ -s "$1" ]] || return 1
  "$PY" "$ROOT/tools/junit_counts.py" "$1" 2>/dev/null
}

# judge NAME RESULT REPORT [NOTE]: records the suite. RESULT is what its exit status said:
# empty when it exited 0, else the row's text (e.g. "failed (pytest exit 1)"). An exit 0
# passes only if REPORT says tests ran and none failed; NOTE goes after "passed".
judge() {
  local name=$1 result=$2 report=$3 note=${4:-} counts p f s
  if counts=$(junit_counts "$report"); then
    read -r p f s <<<"$counts"
  else
    counts="-"
  fi
  if [[ -n "$result" ]]; then
    record "$name" "$result" "$counts"
  elif [[ "$counts" == "-" ]]; then
    record "$name" "failed (no test report at $report)" "-"
  elif (( f > 0 )); then
    record "$name" "failed ($f failed in $report although the suite exited 0)" "$counts"
  elif (( p == 0 )); then
    if is_ci; then
      record "$name" "failed (nothing ran: $s skipped, CI=true)" "$counts"
    else
      record "$name" "skipped (nothing ran: $s skipped)" "$counts"
    fi
  else
    record "$name" "passed${note:+ ($note)}" "$counts"
  fi
}

# The "tried" count of a security report (tests/security/conftest.py writes it); 0 without one.
attacks_tried() {
  "$PY" -c 'import json, sys
try:
    n = json.load(open(sys.argv[1])).get("tried", 0)
except (OSError, ValueError, AttributeError):
    n = 0
print(n if isinstance(n, int) else 0)' "$1" 2>/dev/null || echo 0
}

# attacks_verdict RESULT TRIED: the security suite's row text. An exit 0 whose report tried
# no attack proves nothing about containment: failed under CI, skipped elsewhere.
attacks_verdict() {
  local result=$1 tried=$2
  if [[ -z "$result" ]] && ! (( tried > 0 )); then
    if is_ci; then
      result="failed (no attack tried: the security report says tried=$tried)"
    else
      result="skipped (no attack tried: the security report says tried=$tried)"
    fi
  fi
  echo "$result"
}

# drift_verdict RC REPORT WHAT: the row of a suite that reports drift and never fails the run
# (e2b-drift: the e2b suite's tests with the newest SDK releases). "passed (WHAT)" when pytest
# exited 0 and the report shows tests ran and none failed; else "drift (...)" naming the failed
# tests (at most 8), which finish() counts as neither passed nor failed.
drift_verdict() {
  local rc=$1 report=$2 what=$3 counts p f s names
  if counts=$(junit_counts "$report"); then
    read -r p f s <<<"$counts"
  else
    echo "drift (no test report at $report, pytest exit $rc; $what)"
    return
  fi
  if [[ $rc -eq 0 ]] && (( f == 0 && p > 0 )); then
    echo "passed ($what)"
  elif (( f > 0 )); then
    names=$("$PY" "$ROOT/tools/junit_counts.py" --failed "$report" 2>/dev/null | head -8 |
            sed 's/.*:://' | paste -sd' ' -)
    echo "drift ($f failed with $what: $names)"
  else
    echo "drift (pytest exit $rc, $p passed, $s skipped; $what)"
  fi
}

# pytest's exit status as a row's text (empty for 0).
pytest_result() {
  case $1 in
    0) echo "" ;;
    5) echo "failed (no tests ran: pytest collected none)" ;;
    124) echo "failed (timed out)" ;;
    137) echo "failed (killed: SIGKILL, the timeout's grace ran out or the OOM killer)" ;;
    *) echo "failed (pytest exit $1)" ;;
  esac
}

# run_budgeted BUDGET_S CMD...: runs CMD under timeout(1) and sets BUDGET_OUTCOME to ok,
# over-budget (the budget ran out: timeout's TERM, exit 124, or its KILL after the grace,
# exit 137 once the budget had passed), killed (SIGKILL before the budget ran out: the OOM
# killer, exit 137 too) or failed; BUDGET_RC to the exit status. 137 alone cannot tell an OOM
# kill from timeout's own KILL, so the time taken decides.
run_budgeted() {
  local budget=$1 t0 t1
  shift
  t0=$(date +%s%N)
  timeout -k "${SBX_TEST_KILL_GRACE_S:-10}" "$budget" "$@"
  BUDGET_RC=$?
  t1=$(date +%s%N)
  local took_ms=$(( (t1 - t0) / 1000000 ))
  if [[ $BUDGET_RC -eq 0 ]]; then
    BUDGET_OUTCOME=ok
  elif [[ $BUDGET_RC -eq 124 ]] || { [[ $BUDGET_RC -eq 137 ]] && (( took_ms >= budget * 1000 )); }; then
    BUDGET_OUTCOME=over-budget
  elif [[ $BUDGET_RC -eq 137 ]]; then
    BUDGET_OUTCOME=killed
  else
    BUDGET_OUTCOME=failed
  fi
}

# The final tables and the summary line; exits non-zero if any suite failed or none passed.
# A "drift" row (drift_verdict) is reported on its own line and fails nothing.
finish() {
  local passed=0 failed=0 skipped=0 i p f s drift=() why=0
  # Why each failed suite failed, from its report, next to the table: a long CI log is kept
  # only at its head and its tail, and the failure itself sits in the cut middle.
  for i in "${!NAMES[@]}"; do
    case "${RESULTS[$i]}" in passed*|skipped*|drift*) continue ;; esac
    [[ -n "${RESULTS_DIR:-}" && -s "$RESULTS_DIR/${NAMES[$i]}.xml" ]] || continue
    (( why++ == 0 )) && banner "why the failed suites failed (first 1500 characters of each failure)"
    echo "  ${NAMES[$i]}:"
    "$PY" "$ROOT/tools/junit_counts.py" --why "$RESULTS_DIR/${NAMES[$i]}.xml" 2>&1 | sed 's/^/    /'
  done
  banner "results"
  printf '  %-14s %7s %7s %8s  %s\n' suite passed failed skipped result
  for i in "${!NAMES[@]}"; do
    p=- f=- s=-
    [[ "${COUNTS[$i]}" != "-" ]] && read -r p f s <<<"${COUNTS[$i]}"
    printf '  %-14s %7s %7s %8s  %s\n' "${NAMES[$i]}" "$p" "$f" "$s" "${RESULTS[$i]}"
    case "${RESULTS[$i]}" in
      passed*) passed=$((passed + 1)) ;;
      skipped*) skipped=$((skipped + 1)) ;;
      drift*) drift+=("${NAMES[$i]}") ;;
      *) failed=$((failed + 1)) ;;
    esac
  done
  banner "time per suite (wall seconds)"
  for i in "${!NAMES[@]}"; do
    printf '  %-14s %6s\n' "${NAMES[$i]}" "${WALL[$i]}"
  done
  echo "total time: $(elapsed)s"
  if [[ ${#drift[@]} -gt 0 ]]; then
    echo "drift: ${drift[*]} (newer releases than the pinned ones fail some tests; not a failure of this run)"
  fi
  if [[ $skipped -gt 0 ]]; then
    echo "summary: $passed passed, $failed failed, $skipped skipped"
  else
    echo "summary: $passed passed, $failed failed"
  fi
  [[ $failed -eq 0 && $passed -gt 0 ]]
  exit $?
}
