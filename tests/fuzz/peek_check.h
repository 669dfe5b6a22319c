// The properties both peek fuzz targets check (net/peek.h): never a crash, a returned name is
// normalized, and a decision never changes with more bytes nor differs from a decided prefix.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "net/peek.h"

namespace sbx::fuzz {

inline void Require(bool ok) {
  if (!ok) std::abort();
}

template <typename Parser>
void CheckPeek(Parser parse, std::string_view in) {
  using net::PeekState;
  const net::PeekResult r = parse(in);
  if (r.state == PeekState::kName) {
    Require(!r.name.empty() && net::NormalizeHostName(r.name) == r.name);
  }
  if (r.state != PeekState::kNeedMore) {
    std::string more(in);
    more += "\x16\x03GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    const net::PeekResult m = parse(more);
    Require(m.state == r.state && m.name == r.name);
  }
  for (size_t cut : {in.size() / 2, in.size() * 3 / 4, in.size() > 0 ? in.size() - 1 : 0}) {
    const net::PeekResult p = parse(in.substr(0, cut));
    if (p.state != PeekState::kNeedMore) Require(p.state == r.state && p.name == r.name);
  }
}

}  // namespace sbx::fuzz
