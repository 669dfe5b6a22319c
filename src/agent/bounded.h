// What the agent reports is chosen by guest code (argv, file names, directory sizes), and
// sbxd refuses a reply past the bounds of protocol/limits.h. These helpers keep the agent's
// replies inside them by construction: strings are cut, lists are built as text entry by
// entry and stop (with "truncated": true) before they would pass their byte or entry bound,
// and argv is read from /proc in a bounded window, never whole.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/limits.h"
#include "protocol/protocol.h"

namespace sbx::agent {

// `s` cut to at most `max` bytes, never inside a UTF-8 sequence (a cut sequence would only
// become U+FFFD in the reply).
std::string CutField(std::string_view s, size_t max = protocol::kMaxFieldBytes);

// The JSON text {"ok":true,"<key>":[entry,...],"truncated":bool}, built entry by entry so
// that no tree of all entries ever exists. Add() refuses (and marks the reply truncated) an
// entry that would take the list past `max_entries` or the finished reply past `max_bytes`.
class ListReply {
 public:
  ListReply(std::string_view key, size_t max_entries,
            size_t max_bytes = protocol::kMaxGuestReplyBytes);
  bool Add(const protocol::Json& entry);
  void MarkTruncated() { truncated_ = true; }
  // True once an entry was refused: the reply takes no more.
  bool full() const { return full_; }
  bool truncated() const { return truncated_; }
  size_t entries() const { return entries_; }
  // The payload; the ListReply is spent.
  std::string Finish();

 private:
  std::string out_;
  size_t max_entries_, max_bytes_;
  size_t entries_ = 0;
  bool truncated_ = false, full_ = false;
};

// A process's argv as the reply carries it: at most kMaxArgvEntries entries, kMaxArgBytes
// per entry and kMaxArgvBytes in all; `truncated` when anything was left out.
struct BoundedArgv {
  std::vector<std::string> args;
  bool truncated = false;
};

// How much of /proc/PID/cmdline is ever read: the bytes the bounds can keep and their NUL
// separators. An entry longer than kMaxArgBytes costs its whole length in this window, so
// what follows a huge entry may be cut too (and the argv is flagged).
inline constexpr size_t kArgvReadWindow =
    protocol::kMaxArgvBytes + protocol::kMaxArgvEntries;

// Splits the NUL-separated `window` (the first bytes of a cmdline); `more` says the cmdline
// goes on past it.
BoundedArgv ParseArgv(std::string_view window, bool more);
// Reads at most kArgvReadWindow + 1 bytes of the cmdline file open at `fd`.
BoundedArgv ReadArgv(int fd);

}  // namespace sbx::agent
