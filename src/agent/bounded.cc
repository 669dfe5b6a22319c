#include "agent/bounded.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace sbx::agent {

using protocol::Json;

std::string CutField(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  // s[n] is the first byte left out: when it continues a sequence, drop that sequence's
  // start too (at most 3 bytes back in valid UTF-8; invalid bytes are cut anywhere).
  for (int i = 0; i < 3 && n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80; ++i) --n;
  if ((static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n = max;
  return std::string(s.substr(0, n));
}

namespace {
// `],"truncated":false}` is the longest tail a reply can get.
constexpr size_t kTailBytes = sizeof(R"(],"truncated":false})") - 1;
}  // namespace

ListReply::ListReply(std::string_view key, size_t max_entries, size_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {
  out_ = R"({"ok":true,")";
  out_ += key;  // ours, never a guest's
  out_ += R"(":[)";
}

bool ListReply::Add(const Json& entry) {
  if (full_) return false;
  // error_handler_t::replace: a guest's bytes that are not UTF-8 become U+FFFD instead of
  // an exception; dump() of an entry is flat (no untrusted nesting), so it cannot recurse deep.
  const std::string text = entry.dump(-1, ' ', false, Json::error_handler_t::replace);
  const size_t sep = entries_ > 0 ? 1 : 0;
  if (entries_ >= max_entries_ || out_.size() + sep + text.size() + kTailBytes > max_bytes_) {
    full_ = truncated_ = true;
    return false;
  }
  if (sep) out_ += ',';
  out_ += text;
  ++entries_;
  return true;
}

std::string ListReply::Finish() {
  out_ += truncated_ ? R"(],"truncated":true})" : R"(],"truncated":false})";
  return std::move(out_);
}

BoundedArgv ParseArgv(std::string_view window, bool more) {
  BoundedArgv r;
  size_t budget = protocol::kMaxArgvBytes;
  size_t pos = 0;
  while (pos < window.size()) {
    size_t end = window.find('\0', pos);
    // The window's last piece without its NUL is cut when the cmdline goes on (a process
    // that rewrote its argv may also end without one: then it is whole).
    const bool whole = end != std::string_view::npos || !more;
    if (end == std::string_view::npos) end = window.size();
    const std::string_view arg = window.substr(pos, end - pos);
    pos = end + 1;
    if (r.args.size() >= protocol::kMaxArgvEntries || (budget == 0 && !arg.empty())) {
      r.truncated = true;
      return r;
    }
    const size_t keep = std::min({arg.size(), protocol::kMaxArgBytes, budget});
    std::string kept = CutField(arg, keep);
    if (kept.size() < arg.size() || !whole) r.truncated = true;
    budget -= kept.size();
    r.args.push_back(std::move(kept));
  }
  if (more) r.truncated = true;
  return r;
}

BoundedArgv ReadArgv(int fd) {
  // One byte past the window tells whether the cmdline goes on.
  std::string buf(kArgvReadWindow + 1, '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  const bool more = got > kArgvReadWindow;
  return ParseArgv(std::string_view(buf.data(), std::min(got, kArgvReadWindow)), more);
}

}  // namespace sbx::agent
