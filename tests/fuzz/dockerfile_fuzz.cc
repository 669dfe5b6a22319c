// Fuzz target for the Dockerfile parser of template builds and its variable substitution
// (src/image/dockerfile.h), which read what clients send. Properties: never crashes; every
// step's line is a line of the input; FROM comes first and only once, ARGs alone before it; a
// shell form is /bin/sh -c; every Parse error names the line or the file ("Dockerfile line " /
// "Dockerfile: "), every Expand error the substitution.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "image/dockerfile.h"

extern const char* const kFuzzSeeds[] = {
    "# syntax=docker/dockerfile:1\nARG BASE=debian:12\nFROM ${BASE}\n"
    "RUN apt-get update && \\\n    # a comment\n    apt-get install -y curl\n"
    "COPY --chown=app:app --chmod=755 a b /dst/\nCMD [\"sh\", \"-c\", \"echo hi\"]\n",
    "# escape=`\r\nFROM busybox\r\nRUN echo a `\r\n  b\r\nWORKDIR C:\\x\r\nUSER 1000:1000\r\n",
    "FROM x\nENV A=1 B=\"two words\" C='$lit' D=\\$E\nENV LEGACY value with  spaces\n"
    "LABEL org.x=\"y\" z=${A:-d}\nARG NAME\nADD [\"s 1\", \"s2\", \"/d\"]\nENTRYPOINT exec app\n",
    "from x AS y\nexpose 80\nCOPY --from=a b c\nRUN [1]\nENV A\nARG\n",
    "${A}$B${C:-x}${D:+y}\\$E${F-${G}}",
    "",
};
extern const size_t kFuzzSeedCount = sizeof(kFuzzSeeds) / sizeof(kFuzzSeeds[0]);

namespace {

int LineCount(std::string_view text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n + (!text.empty() && text.back() != '\n');
}

void CheckStep(const sbx::image::dockerfile::Step& s, int lines) {
  using sbx::image::dockerfile::Kind;
  if (s.line < 1 || s.line > lines || s.text.empty()) std::abort();
  if (s.shell_form && (s.args.size() != 3 || s.args[0] != "/bin/sh" || s.args[1] != "-c")) {
    std::abort();
  }
  if ((s.kind == Kind::kCopy || s.kind == Kind::kAdd) && (s.sources.empty() || s.dest.empty())) {
    std::abort();
  }
  if (s.chmod && *s.chmod > 07777) std::abort();
  if ((s.kind == Kind::kArg && s.pairs.size() != 1) ||
      ((s.kind == Kind::kEnv || s.kind == Kind::kLabel) && s.pairs.empty())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace df = sbx::image::dockerfile;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const int lines = LineCount(text);
  if (auto d = df::Parse(text); d.ok()) {
    if (d->steps.empty() || d->steps.front().kind != df::Kind::kFrom) std::abort();
    if (d->steps.size() + d->args_before_from.size() > 10000) std::abort();
    for (size_t i = 0; i < d->steps.size(); ++i) {
      if (i > 0 && d->steps[i].kind == df::Kind::kFrom) std::abort();
      if (i > 0 && d->steps[i].line <= d->steps[i - 1].line) std::abort();
      CheckStep(d->steps[i], lines);
    }
    for (const auto& s : d->args_before_from) {
      if (s.kind != df::Kind::kArg || s.line >= d->steps.front().line) std::abort();
      CheckStep(s, lines);
    }
  } else {
    const std::string m(d.status().message());
    if (!m.starts_with("Dockerfile line ") && !m.starts_with("Dockerfile: ")) std::abort();
  }
  const std::map<std::string, std::string> vars = {{"A", "a"}, {"B", ""}, {"C", "$A"}};
  if (auto e = df::Expand(text, vars); e.ok()) {
    // With no '$' there is nothing to substitute.
    if (text.find('$') == std::string_view::npos && *e != text) std::abort();
  } else {
    const std::string m(e.status().message());
    if (!m.starts_with("bad variable substitution in \"") &&
        !m.starts_with("variable substitution in \"")) {
      std::abort();
    }
  }
  return 0;
}
