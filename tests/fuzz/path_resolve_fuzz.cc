// Fuzz target for the agent's lexical path validation (src/common/path_resolve.h), which sees
// every path a client sends. Properties: never crashes or throws; an accepted path comes back
// absolute and normalized (no "." / ".." / empty components), valid UTF-8, within the length
// limits, and validating it again is the identity; the root has no parent, every other
// accepted path splits into a parent that is itself accepted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/path_resolve.h"

extern const char* const kFuzzSeeds[] = {
    "/etc/passwd", "relative/file.txt", "../../..", "a/../../b", "/a/./b//c/", ".", "/",
    "/tmp/\xc3\xa9t\xc3\xa9", "/bad/\xff\xfe", "/x/\xed\xa0\x80", "//..//../x", "a/b/c/../../d",
    "/proc/self/fd/3", "\xf0\x9f\x98\x80/emoji",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {
void Check(bool cond) {
  if (!cond) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  // Use part of the input as the workdir too.
  const size_t cut = in.find('|');
  const std::string path = cut == std::string::npos ? in : in.substr(0, cut);
  std::string workdir = cut == std::string::npos ? "/" : in.substr(cut + 1);
  if (workdir.empty() || workdir[0] != '/') workdir = "/" + workdir;
  auto r = sbx::ValidatePath(path, workdir);
  if (!r.ok()) return 0;
  const std::string& p = *r;
  Check(!p.empty() && p[0] == '/');
  Check(p.size() <= sbx::kMaxPathBytes);
  Check(sbx::IsValidUtf8(p));
  Check(p.find('\0') == std::string::npos);
  Check(p == "/" || p.back() != '/');
  Check(p.find("//") == std::string::npos);
  Check(p.find("/./") == std::string::npos && p.find("/../") == std::string::npos);
  Check(!(p.size() >= 2 && p.compare(p.size() - 2, 2, "/.") == 0));
  Check(!(p.size() >= 3 && p.compare(p.size() - 3, 3, "/..") == 0));
  auto again = sbx::ValidatePath(p, "/");
  Check(again.ok() && *again == p);
  auto split = sbx::SplitParent(p);
  Check(split.ok() == (p != "/"));
  if (split.ok()) {
    auto parent = sbx::ValidatePath(split->first, "/");
    Check(parent.ok() && *parent == split->first);
    Check(!split->second.empty() && split->second.find('/') == std::string::npos);
  }
  return 0;
}
