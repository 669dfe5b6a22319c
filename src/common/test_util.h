// Shared by the tests: a test that needs something this process lacks (root, a kernel
// feature) skips on a developer's machine but fails in CI, where SBX_TESTS_MUST_RUN=1 says
// every capability the tests need must be there.
#pragma once

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

namespace sbx::testing {

inline bool TestsMustRun() {
  const char* v = std::getenv("SBX_TESTS_MUST_RUN");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace sbx::testing

// `why` is a stream expression: SBX_SKIP_OR_FAIL("no memory controller under " << dir).
#define SBX_SKIP_OR_FAIL(why)                                              \
  do {                                                                     \
    if (::sbx::testing::TestsMustRun()) FAIL() << why << " (SBX_TESTS_MUST_RUN=1)"; \
    GTEST_SKIP() << why;                                                   \
  } while (0)
