// One log record as one line of text, in the two formats sbx writes: JSON for journald and log
// files, and a human form for terminals. Shared by sbxd (through common/log.h, which feeds it
// from spdlog) and sbx-agent, which is a static binary without spdlog: this file needs only the
// standard library.
//
// Log messages carry untrusted bytes (process output, paths and ids from requests, kernel
// error text), so every string is escaped here: a record is always exactly one line, the JSON
// form is always valid JSON (invalid UTF-8 becomes U+FFFD), and the text form never hands a
// terminal a control sequence.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace sbx::log {

enum class Format { kText, kJson };

// A context field of a record ("request_id", "sandbox", ...). Empty values are left out.
struct Field {
  std::string_view key;
  std::string_view value;
};

// A structured attribute of one record (method, status, duration_ms, ...): a JSON string or
// number. Attributes are the machine-readable copy of what the message already says, so the
// text form, read by people, shows only the message. Holds views: it must not outlive what it
// was built from.
class Attr {
 public:
  enum class Kind { kString, kInt, kDouble };

  Attr(std::string_view key, std::string_view value) : key_(key), kind_(Kind::kString), s_(value) {}
  Attr(std::string_view key, const char* value) : Attr(key, std::string_view(value)) {}
  Attr(std::string_view key, const std::string& value) : Attr(key, std::string_view(value)) {}
  template <std::integral T>
    requires(!std::same_as<T, bool> && !std::same_as<T, char>)
  Attr(std::string_view key, T value) : key_(key), kind_(Kind::kInt), i_(static_cast<int64_t>(value)) {}
  Attr(std::string_view key, double value) : key_(key), kind_(Kind::kDouble), d_(value) {}

  std::string_view key() const { return key_; }
  Kind kind() const { return kind_; }
  std::string_view str() const { return s_; }
  int64_t integer() const { return i_; }
  double number() const { return d_; }

 private:
  std::string_view key_;
  Kind kind_;
  std::string_view s_;
  int64_t i_ = 0;
  double d_ = 0;
};

struct Record {
  std::chrono::system_clock::time_point time;
  std::string_view level;  // as it should appear: "info", "warn", ...
  std::string_view msg;
  std::span<const Field> fields;
  std::span<const Attr> attrs;
};

// Appends `r` as one line ending in '\n'.
//   JSON: {"ts":"2026-11-30T14:00:00.123Z","level":"info","msg":"...",<fields>,<attrs>}
//   text: 2026-11-30T14:00:00.123Z info msg key=value key="value with spaces" (fields only)
// `level_color` (text only): an ANSI SGR sequence such as "\x1b[32m" put around the level.
void AppendRecord(std::string& out, Format format, const Record& r,
                  std::string_view level_color = {});

// `s` as a quoted JSON string: '"' and '\' escaped, control characters (C0, DEL, C1) as \uXXXX
// or their short forms, each maximal invalid UTF-8 subsequence as U+FFFD.
void AppendJsonString(std::string& out, std::string_view s);
// `s` for a terminal: valid UTF-8 kept, control characters as \n, \t, \r or \xHH / \uXXXX,
// invalid bytes as \xHH.
void AppendTextEscaped(std::string& out, std::string_view s);
// RFC 3339, UTC, milliseconds: "2026-11-30T14:00:00.123Z".
void AppendTimestamp(std::string& out, std::chrono::system_clock::time_point t);

}  // namespace sbx::log
