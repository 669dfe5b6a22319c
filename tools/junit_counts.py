#!/usr/bin/env python3
"""Prints "PASSED FAILED SKIPPED" for a JUnit XML report, as tools/test.sh reads it: what a
suite really ran, rather than its exit status alone.

Reads both dialects the suites write: pytest's --junitxml (<skipped>, <failure>, <error>
children) and ctest's --output-junit (the same children, plus status="notrun"/"disabled"
on tests that did not run; a "Not Run" that is not a skip counts as failed, as ctest does). A test case counts once: failed if it has a failure or an error
(a pytest teardown error after a pass included), else skipped, else passed.

Usage: python3 tools/junit_counts.py REPORT.xml   (exit 2 when the report cannot be read)
       python3 tools/junit_counts.py --failed REPORT.xml   the failed tests' names, one a line
       (what the drift suite prints: its row must say which tests a new SDK release broke)
       python3 tools/junit_counts.py --why REPORT.xml   each failed test's name and the start of
       its failure message (tools/test.sh prints them next to the results table: a CI log that
       is cut in the middle still says why a suite failed)
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> tuple[int, int, int]:
    values = list(outcomes(path).values())
    return values.count("passed"), values.count("failed"), values.count("skipped")


def outcomes(path: str) -> dict[tuple[str, str], str]:
    """(classname, name) -> passed / failed / skipped, for each test case."""
    root = ET.parse(path).getroot()
    cases: dict[tuple[str, str], str] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for i, tc in enumerate(root.iter("testcase")):
        if tc.find("failure") is not None or tc.find("error") is not None or \
                tc.get("status") in ("fail", "failed"):
            outcome = "failed"
        elif tc.get("status") == "notrun" and not (tc.find("skipped") is not None and
                                                   tc.find("skipped").get("message", "").startswith("SKIP_")):
            # ctest's "Not Run" (the executable is missing, a fixture failed) is a failure that
            # its JUnit report files under <skipped>; a real skip says SKIP_REGULAR_EXPRESSION_
            # MATCHED (gtest's "[  SKIPPED ]") or SKIP_RETURN_CODE=N.
            outcome = "failed"
        elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled", "skipped"):
            outcome = "skipped"
        else:
            outcome = "passed"
        name = tc.get("name")
        key = (tc.get("classname", ""), name) if name else ("", f"#{i}")
        if rank[outcome] >= rank.get(cases.get(key, "passed"), 0):
            cases[key] = outcome
    return cases


def failed_names(path: str) -> list[str]:
    return [f"{cls}::{name}" if cls else name
            for (cls, name), outcome in outcomes(path).items() if outcome == "failed"]


def failure_reasons(path: str, limit: int = 1500) -> list[str]:
    """'name: message' of each failed test case, the message cut to `limit` characters."""
    root = ET.parse(path).getroot()
    out = []
    for tc in root.iter("testcase"):
        bad = tc.find("failure")
        if bad is None:
            bad = tc.find("error")
        if bad is None:
            continue
        cls, name = tc.get("classname", ""), tc.get("name", "?")
        text = (bad.get("message") or "").strip() or (bad.text or "").strip()
        if text:
            if len(text) > limit:
                text = text[:limit] + f" [... {len(text) - limit} more characters in {path}]"
        else:  # ctest's reports put the test's output under <system-out>: its end says why
            log = tc.find("system-out")
            text = ((log.text or "") if log is not None else "").strip()
            text = text[-limit:] if text else "(no message)"
        out.append(f"{cls + '::' if cls else ''}{name}: {text}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] in ("--why", "--failed"):
        report, why = argv[2], argv[1] == "--why"
        try:
            lines = failure_reasons(report) if why else failed_names(report)
        except (OSError, ET.ParseError) as e:
            print(f"junit_counts: cannot read {report}: {e}", file=sys.stderr)
            return 2
        shown = lines[:10] if why else lines
        for line in shown:
            print(line)
        if len(lines) > len(shown):
            print(f"... and {len(lines) - len(shown)} more failed tests in {report}")
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        p, f, s = counts(argv[1])
    except (OSError, ET.ParseError) as e:
        print(f"junit_counts: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 2
    print(p, f, s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
