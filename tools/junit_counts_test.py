#!/usr/bin/env python3
"""Unit tests of tools/junit_counts.py on reports as pytest 7 and ctest 3.25 write them
(trimmed copies of real ones); run by ctest as junit_counts_test."""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import junit_counts  # noqa: E402

# pytest --junitxml: a pass, a failure, a skip, a teardown error after a pass, a setup error,
# and two parametrized passes.
PYTEST = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2"
failures="1" skipped="1" tests="8"><testcase classname="test_s" name="test_ok" time="0.001" />
<testcase classname="test_s" name="test_fail" time="0.001"><failure message="assert False">x</failure></testcase>
<testcase classname="test_s" name="test_skip" time="0.001"><skipped type="pytest.skip" message="x">x</skipped></testcase>
<testcase classname="test_s" name="test_teardown" time="0.001"><error message="failed on teardown">x</error></testcase>
<testcase classname="test_s" name="test_setup" time="0.001"><error message="failed on setup">x</error></testcase>
<testcase classname="test_s" name="test_param[1]" time="0.001" />
<testcase classname="test_s" name="test_param[2]" time="0.001" /></testsuite></testsuites>
"""

# ctest --output-junit: run, fail, a gtest skip, a SKIP_RETURN_CODE skip, a test whose binary
# is missing ("Not Run", a failure for ctest), and a disabled test.
CTEST = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="6" failures="1" disabled="1" skipped="3">
<testcase name="ok" classname="ok" time="0.007" status="run"><system-out></system-out></testcase>
<testcase name="bad" classname="bad" time="0.006" status="fail"><failure message=""/></testcase>
<testcase name="skip" classname="skip" time="0.005" status="notrun">
  <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/><system-out>[  SKIPPED ] x</system-out></testcase>
<testcase name="skip77" classname="skip77" time="0.004" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/></testcase>
<testcase name="notrun" classname="notrun" time="0" status="notrun"><skipped message="Unable to find executable"/></testcase>
<testcase name="dis" classname="dis" time="0" status="disabled"><system-out>Disabled</system-out></testcase>
</testsuite>
"""


class JunitCountsTest(unittest.TestCase):
    def write(self, text):
        fd, path = tempfile.mkstemp(suffix=".xml", prefix="sbx-junit-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.unlink, path)
        return path

    def test_why_names_each_failure_with_its_message(self):
        reasons = junit_counts.failure_reasons(self.write(PYTEST))
        self.assertEqual(reasons, ["test_s::test_fail: assert False",
                                   "test_s::test_teardown: failed on teardown",
                                   "test_s::test_setup: failed on setup"])
        # ctest: an empty message, the output's end instead; a long message is cut and says so.
        ctest = CTEST.replace('<failure message=""/></testcase>',
                              '<failure message=""/><system-out>start\nExpected: 1\n</system-out></testcase>')
        self.assertEqual(junit_counts.failure_reasons(self.write(ctest)),
                         ["bad::bad: start\nExpected: 1"])
        long = PYTEST.replace('message="assert False"', f'message="{"x" * 3000}"')
        first = junit_counts.failure_reasons(self.write(long), limit=100)[0]
        self.assertTrue(first.startswith("test_s::test_fail: " + "x" * 100 + " [... 2900 more"), first)

    def test_pytest_report(self):
        self.assertEqual(junit_counts.counts(self.write(PYTEST)), (3, 3, 1))

    def test_ctest_report(self):
        # Not Run is a failure (ctest lists it under FAILED), disabled a skip.
        self.assertEqual(junit_counts.counts(self.write(CTEST)), (1, 2, 3))

    def test_a_test_case_counts_once(self):
        # A pytest teardown error reported beside the same test's pass.
        xml = ('<testsuite><testcase classname="c" name="t"/>'
               '<testcase classname="c" name="t"><error message="teardown"/></testcase></testsuite>')
        self.assertEqual(junit_counts.counts(self.write(xml)), (0, 1, 0))

    def test_an_empty_report_counts_nothing(self):
        self.assertEqual(junit_counts.counts(self.write('<testsuites><testsuite name="pytest" tests="0"/></testsuites>')),
                         (0, 0, 0))

    def test_failed_names(self):
        # A failure, a teardown error after a pass and a setup error; skips and passes are not.
        self.assertEqual(junit_counts.failed_names(self.write(PYTEST)),
                         ["test_s::test_fail", "test_s::test_teardown", "test_s::test_setup"])
        res = subprocess.run([sys.executable, str(HERE / "junit_counts.py"), "--failed",
                              self.write(CTEST)], capture_output=True, text=True)
        self.assertEqual((res.returncode, res.stdout), (0, "bad::bad\nnotrun::notrun\n"))

    def test_the_command_line(self):
        script = str(HERE / "junit_counts.py")
        res = subprocess.run([sys.executable, script, self.write(CTEST)], capture_output=True, text=True)
        self.assertEqual((res.returncode, res.stdout), (0, "1 2 3\n"))
        res = subprocess.run([sys.executable, script, self.write("not xml")], capture_output=True, text=True)
        self.assertEqual(res.returncode, 2)
        res = subprocess.run([sys.executable, script, "/nonexistent/report.xml"], capture_output=True, text=True)
        self.assertEqual(res.returncode, 2)


if __name__ == "__main__":
    unittest.main()
