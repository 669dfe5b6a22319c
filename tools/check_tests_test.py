#!/usr/bin/env python3
"""Unit tests of tools/check_tests.py on small fixture trees (run by ctest as
check_tests_test): an orphaned *_test.cc and every form of raw skip are found; the helpers,
comments and strings are not flagged."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_tests  # noqa: E402

HELPER_H = """\
#pragma once
// GTEST_SKIP in a comment is not a skip.
#define SBX_SKIP_OR_FAIL(why)                                              \\
  do {                                                                     \\
    if (::sbx::testing::TestsMustRun()) FAIL() << why; \\
    GTEST_SKIP() << why;                                                   \\
  } while (0)
#define SBX_SKIP_NOT_APPLICABLE(why) GTEST_SKIP() << "not applicable: " << why
"""

CONFTEST = """\
import pytest

def skip_or_fail(reason):
    pytest.skip(reason)

def not_applicable_on_fake_runtime(reason):
    pytest.skip(reason)

def ns_runtime_only(reason):
    return pytest.mark.skipif(True, reason=reason)
"""


class Tree:
    def __init__(self, test):
        self.root = Path(tempfile.mkdtemp(prefix="sbx-check-tests-"))
        test.addCleanup(shutil.rmtree, self.root, True)
        self.write("CMakeLists.txt", "add_subdirectory(src)\n")
        self.write("src/common/test_util.h", HELPER_H)
        self.write("tests/e2e/conftest.py", CONFTEST)

    def write(self, rel, text):
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
        return p

    def orphans(self):
        return check_tests.check_orphans_source(self.root)[0]

    def skips(self):
        return check_tests.check_skips(self.root)[0]


class OrphanTest(unittest.TestCase):
    def test_registered_tests_pass(self):
        t = Tree(self)
        t.write("src/common/a_test.cc", "")
        t.write("src/common/b_test.cc", "")
        t.write("src/common/c_test.cc", "")
        t.write("src/common/CMakeLists.txt", """\
            # sbx_cc_test(NAME commented SRCS gone_test.cc)
            sbx_cc_test(NAME a_test SRCS a_test.cc DEPS sbx_common LABELS unit)
            sbx_cc_test(NAME b_test
              SRCS b_test.cc "c_test.cc" DEPS x)
            """)
        self.assertEqual(t.orphans(), [])

    def test_a_dropped_registration_is_an_orphan(self):
        # What merge 61842ae did to metrics_test.cc.
        t = Tree(self)
        t.write("src/common/common_test.cc", "")
        t.write("src/common/metrics_test.cc", "")
        t.write("src/common/CMakeLists.txt", """\
            sbx_cc_test(NAME common_test SRCS common_test.cc DEPS sbx_common)
            # sbx_cc_test(NAME metrics_test SRCS metrics_test.cc DEPS sbx_common)
            """)
        problems = t.orphans()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/common/metrics_test.cc", problems[0])

    def test_a_file_of_another_directory_does_not_count(self):
        t = Tree(self)
        t.write("src/a/x_test.cc", "")
        t.write("src/b/x_test.cc", "")
        t.write("src/a/CMakeLists.txt", "sbx_cc_test(NAME x SRCS x_test.cc)\n")
        problems = t.orphans()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("src/b/x_test.cc", problems[0])

    def test_variables_and_plain_add_test(self):
        t = Tree(self)
        t.write("tests/fuzz/y_test.cc", "")
        t.write("tests/fuzz/z_test.cc", "")
        t.write("tests/fuzz/CMakeLists.txt", """\
            set(SRCS_Y y_test.cc)
            add_executable(y ${SRCS_Y})
            add_test(NAME y_smoke COMMAND y --random 10)
            add_executable(z z_test.cc)
            """)
        problems = t.orphans()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("tests/fuzz/z_test.cc", problems[0])

    def test_script_tests_need_an_add_test(self):
        t = Tree(self)
        t.write("tools/a_test.py", "")
        t.write("bench/b_test.py", "")
        t.write("bench/CMakeLists.txt", "add_test(NAME b COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/b_test.py)\n")
        problems = t.orphans()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("tools/a_test.py", problems[0])

    def test_build_trees_are_not_searched(self):
        t = Tree(self)
        t.write("src/build/CMakeCache.txt", "")
        t.write("src/build/generated_test.cc", "")
        self.assertEqual(t.orphans(), [])


class BuildTreeTest(unittest.TestCase):
    """--build-dir: what build.ninja compiles and what ctest lists (a hand-written
    CTestTestfile.cmake, so no compiler is needed)."""

    def test_the_build_tree_is_checked(self):
        t = Tree(self)
        for name in ("run", "unlisted", "unbuilt", "notcompiled"):
            t.write(f"src/a/{name}_test.cc", "")
        b = t.root / "build"
        ninja = []
        for name in ("run", "unlisted", "unbuilt"):
            ninja.append(f"build src/a/CMakeFiles/{name}.dir/{name}_test.cc.o: CXX_COMPILER__{name}_RelWithDebInfo "
                         f"{t.root}/src/a/{name}_test.cc || cmake_object_order_depends_target_{name}")
            ninja.append(f"build tests/{name} src/a/{name}[1]_tests.cmake: CXX_EXECUTABLE_LINKER__{name}_RelWithDebInfo "
                         f"src/a/CMakeFiles/{name}.dir/{name}_test.cc.o")
        t.write("build/build.ninja", "\n".join(ninja) + "\n")
        t.write("build/tests/run", "#!/bin/sh\n").chmod(0o755)  # ctest lists no command for a missing binary
        t.write("build/CMakeCache.txt", "")
        t.write("build/CTestTestfile.cmake",
                f'add_test(A.One "{b}/tests/run" "--gtest_filter=A.One")\n'
                f'add_test(unbuilt_NOT_BUILT "unbuilt_NOT_BUILT")\n')
        problems = check_tests.check_orphans_build(t.root, b)
        self.assertEqual(len(problems), 3, problems)
        joined = "\n".join(problems)
        self.assertIn("ORPHAN: src/a/unlisted_test.cc is compiled into unlisted, but ctest", joined)
        self.assertIn("NOT BUILT: src/a/unbuilt_test.cc", joined)
        self.assertIn("ORPHAN: src/a/notcompiled_test.cc is compiled into no target", joined)
        self.assertNotIn("run_test.cc", joined)

    def test_an_unconfigured_build_dir_fails(self):
        t = Tree(self)
        problems = check_tests.check_orphans_build(t.root, t.root / "nothing")
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("configure the build first", problems[0])


class SkipLintTest(unittest.TestCase):
    def test_the_helpers_themselves_pass(self):
        self.assertEqual(Tree(self).skips(), [])

    def test_raw_gtest_skips_are_found(self):
        t = Tree(self)
        t.write("src/agent/a_test.cc", """\
            #include "common/test_util.h"
            TEST(A, Root) {
              if (geteuid() != 0) GTEST_SKIP() << "needs root";
            }
            TEST(A, DISABLED_Later) {}
            TEST(A, Fine) {
              // GTEST_SKIP() in a comment
              const char* s = "GTEST_SKIP() in a string";
              SBX_SKIP_OR_FAIL("ok");
            }
            """)
        problems = t.skips()
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("src/agent/a_test.cc:3: GTEST_SKIP", problems[0])
        self.assertIn("src/agent/a_test.cc:5: a DISABLED_ test", problems[1])

    def test_a_skip_macro_defined_elsewhere_is_found(self):
        t = Tree(self)
        t.write("tests/integration/util.h", "#define MY_SKIP() GTEST_SKIP() << \"x\"\n")
        self.assertEqual(len(t.skips()), 1)

    def test_raw_pytest_skips_are_found(self):
        t = Tree(self)
        t.write("tests/e2e/test_x.py", """\
            import pytest
            import unittest
            from pytest import skip as sk, mark
            from conftest import skip_or_fail

            pytestmark = pytest.mark.skipif(False, reason="x")

            @pytest.mark.skip(reason="later")
            def test_a():
                pytest.skip("no")

            @mark.xfail
            def test_b():
                sk("no")
                pytest.importorskip("yaml")

            class T(unittest.TestCase):
                @unittest.skipIf(True, "x")
                def test_c(self):
                    self.skipTest("no")

            def test_fine(report):
                skip_or_fail("needs root")
                assert not report.skipped  # "pytest.skip" in a string
            """)
        lines = sorted(int(p.split(":")[2]) for p in t.skips())
        self.assertEqual(lines, [6, 8, 10, 12, 14, 15, 18, 20], t.skips())

    def test_a_raw_skip_beside_the_helpers_is_found(self):
        t = Tree(self)
        t.write("tests/e2e/conftest.py", CONFTEST + "\n\ndef other():\n    pytest.skip('no')\n")
        problems = t.skips()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("tests/e2e/conftest.py:", problems[0])

    def test_the_command_line_names_the_problem_and_fails(self):
        t = Tree(self)
        t.write("src/common/metrics_test.cc", "TEST(M, X) { GTEST_SKIP(); }\n")
        res = subprocess.run([sys.executable, str(HERE / "check_tests.py"), "--root", str(t.root)],
                             capture_output=True, text=True)
        self.assertEqual(res.returncode, 1, res.stdout)
        self.assertIn("ORPHAN: src/common/metrics_test.cc", res.stdout)
        self.assertIn("RAW SKIP: src/common/metrics_test.cc:1", res.stdout)


class RepositoryTest(unittest.TestCase):
    def test_this_repository_passes(self):
        # The real tree, as CI sees it before the build.
        res = subprocess.run([sys.executable, str(HERE / "check_tests.py")], capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
