#include "protocol/guest_reply.h"

#include <array>
#include <cstdint>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/status_util.h"
#include "protocol/limits.h"
#include "protocol/protocol.h"

namespace sbx::protocol {
namespace {

constexpr std::array<std::string_view, 11> kProcessFields = {
    "pid", "ppid", "pgid", "state", "comm", "argv", "argv_truncated",
    "uid", "user", "started_at", "session_id"};
constexpr std::array<std::string_view, 9> kEntryFields = {
    "name", "path", "type", "size", "mode", "uid", "gid", "mtime", "symlink_target"};

// Where the SAX pass is in the one shape a reply may have.
enum class At {
  kStart,     // before the root object
  kRoot,      // in the root object
  kError,     // in root["error"]
  kList,      // in root[list_key]
  kEntry,     // in one entry
  kArray,     // in an entry's array field
  kDone,      // after the root object
};

class Rewriter : public nlohmann::json_sax<nlohmann::json> {
 public:
  Rewriter(const GuestListSchema& schema, std::string& out) : schema_(schema), out_(out) {}

  bool null() override { return Scalar("null"); }
  bool boolean(bool v) override {
    if (at_ == At::kRoot) {
      if (key_ == "ok") ok_ = v;
      if (key_ == "truncated") truncated_ = v;
      return true;
    }
    return Scalar(v ? "true" : "false");
  }
  bool number_integer(number_integer_t v) override { return Scalar(fmt::format("{}", v)); }
  bool number_unsigned(number_unsigned_t v) override { return Scalar(fmt::format("{}", v)); }
  bool number_float(number_float_t v, const string_t&) override {
    return Scalar(fmt::format("{}", v));
  }
  bool binary(binary_t&) override { return Bad("binary value"); }

  bool string(string_t& v) override {
    switch (at_) {
      case At::kRoot:
        return true;  // an unknown scalar at the top: ignored
      case At::kError:
        if (v.size() > kMaxSmallResponseBytes) return Bad("error string too long");
        if (key_ == "code") code_ = v;
        if (key_ == "message") message_ = v;
        if (key_ == "reason") reason_ = v;
        return true;
      case At::kEntry:
        if (v.size() > kMaxFieldBytes) {
          return Bad(fmt::format("field \"{}\" of {} bytes (limit {})", key_, v.size(),
                                 kMaxFieldBytes));
        }
        if (!BeginField()) return false;
        if (skip_) return true;
        AppendJsonString(out_, v);
        return true;
      case At::kArray:
        if (v.size() > kMaxArgBytes) {
          return Bad(fmt::format("an item of \"{}\" of {} bytes (limit {})", key_, v.size(),
                                 kMaxArgBytes));
        }
        if (++items_ > kMaxArgvEntries) {
          return Bad(fmt::format("\"{}\" has more than {} items", key_, kMaxArgvEntries));
        }
        item_bytes_ += v.size();
        if (item_bytes_ > kMaxArgvBytes) {
          return Bad(fmt::format("\"{}\" has more than {} bytes", key_, kMaxArgvBytes));
        }
        if (skip_) return true;
        if (items_ > 1) out_.push_back(',');
        AppendJsonString(out_, v);
        return true;
      default:
        return Bad("a string outside an entry");
    }
  }

  bool start_object(std::size_t) override {
    switch (at_) {
      case At::kStart:
        at_ = At::kRoot;
        return true;
      case At::kRoot:
        if (key_ != "error") return Bad(fmt::format("an object in \"{}\"", key_));
        at_ = At::kError;
        return true;
      case At::kList:
        if (++entries_ > schema_.max_entries) {
          return Bad(fmt::format("more than {} entries", schema_.max_entries));
        }
        if (entries_ > 1) out_.push_back(',');
        out_.push_back('{');
        at_ = At::kEntry;
        seen_ = 0;
        fields_written_ = 0;
        return true;
      default:
        return Bad("an object nested too deep");
    }
  }
  bool end_object() override {
    switch (at_) {
      case At::kRoot:
        at_ = At::kDone;
        return true;
      case At::kError:
        at_ = At::kRoot;
        return true;
      case At::kEntry:
        out_.push_back('}');
        at_ = At::kList;
        return true;
      default:
        return Bad("unbalanced object");
    }
  }

  bool key(string_t& k) override {
    key_ = k;
    if (at_ == At::kRoot && k == schema_.list_key && saw_list_) return Bad("a second list");
    return true;
  }

  bool start_array(std::size_t) override {
    if (at_ == At::kRoot && key_ == schema_.list_key) {
      saw_list_ = true;
      at_ = At::kList;
      return true;
    }
    if (at_ == At::kEntry && !schema_.array_field.empty() && key_ == schema_.array_field) {
      if (!BeginField()) return false;
      at_ = At::kArray;
      items_ = 0;
      item_bytes_ = 0;
      out_.push_back('[');
      return true;
    }
    return Bad(fmt::format("an array in \"{}\"", key_));
  }
  bool end_array() override {
    if (at_ == At::kArray) {
      out_.push_back(']');
      at_ = At::kEntry;
      return true;
    }
    if (at_ == At::kList) {
      at_ = At::kRoot;
      key_.clear();
      return true;
    }
    return Bad("unbalanced array");
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    if (problem_.empty()) problem_ = fmt::format("not JSON at byte {}: {}", position, ex.what());
    return false;
  }

  bool ok() const { return ok_; }
  bool truncated() const { return truncated_; }
  bool saw_list() const { return saw_list_; }
  const std::string& problem() const { return problem_; }
  const std::string& code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& reason() const { return reason_; }

 private:
  bool Bad(std::string what) {
    if (problem_.empty()) problem_ = std::move(what);
    return false;
  }

  // A scalar other than a string: only entries carry them (the root's are ignored).
  bool Scalar(std::string_view text) {
    if (at_ == At::kRoot || at_ == At::kError) return true;
    if (at_ != At::kEntry) return Bad(fmt::format("a {} outside an entry's field", text));
    if (!BeginField()) return false;
    if (!skip_) out_.append(text);
    return true;
  }

  // Writes `"key":` for an entry's field, or marks it skipped when the schema lacks it.
  bool BeginField() {
    size_t index = schema_.fields.size();
    for (size_t i = 0; i < schema_.fields.size(); ++i) {
      if (schema_.fields[i] == key_) index = i;
    }
    skip_ = index == schema_.fields.size();
    if (skip_) return true;
    if (seen_ & (uint32_t{1} << index)) return Bad(fmt::format("field \"{}\" twice", key_));
    seen_ |= uint32_t{1} << index;
    if (fields_written_++ > 0) out_.push_back(',');
    AppendJsonString(out_, key_);
    out_.push_back(':');
    return true;
  }

  const GuestListSchema& schema_;
  std::string& out_;
  At at_ = At::kStart;
  std::string key_;
  bool ok_ = false;
  bool truncated_ = false;
  bool saw_list_ = false;
  bool skip_ = false;
  size_t entries_ = 0;
  size_t items_ = 0;
  size_t item_bytes_ = 0;
  uint32_t seen_ = 0;
  size_t fields_written_ = 0;
  std::string problem_, code_, message_, reason_;
};

}  // namespace

const GuestListSchema& ProcessesReplySchema() {
  static const GuestListSchema s{"processes", kProcessFields, "argv", kMaxProcessEntries};
  return s;
}

const GuestListSchema& ListReplySchema() {
  static const GuestListSchema s{"entries", kEntryFields, "", kMaxListEntries};
  return s;
}

absl::Status AgentErrorFromFields(std::string_view code, std::string_view message,
                                  std::string_view reason) {
  const std::string name = code.empty() ? "internal" : std::string(code);
  const absl::StatusCode canonical = ErrorCodeFromName(name);
  return ApiError(canonical, reason.empty() ? name : std::string(reason),
                  fmt::format("agent: {}", message.empty() ? "agent refused the request"
                                                           : std::string(message)));
}

absl::StatusOr<std::string> RewriteGuestList(std::string_view payload,
                                             const GuestListSchema& schema,
                                             std::string_view head) {
  auto bad = [](std::string_view what) {
    return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                    fmt::format("agent reply refused: {}", what));
  };
  if (payload.size() > kMaxGuestReplyBytes) {
    return bad(fmt::format("{} bytes (limit {})", payload.size(), kMaxGuestReplyBytes));
  }
  std::string out;
  // The body is about the payload's size (fields dropped, escapes kept); one allocation.
  out.reserve(head.size() + payload.size() + 64);
  out.append(head);
  AppendJsonString(out, schema.list_key);
  out.append(":[");
  Rewriter r(schema, out);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(payload.begin(), payload.end(), &r,
                                       nlohmann::json::input_format_t::json, /*strict=*/true);
  } catch (const std::exception& e) {  // the lexer's own limits; never expected
    return bad(e.what());
  }
  if (!parsed) return bad(r.problem().empty() ? "not a JSON object" : r.problem());
  if (!r.ok()) return AgentErrorFromFields(r.code(), r.message(), r.reason());
  if (!r.saw_list()) return bad(fmt::format("no \"{}\" array", schema.list_key));
  out.append("],\"truncated\":");
  out.append(r.truncated() ? "true" : "false");
  out.push_back('}');
  return out;
}

void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      switch (c) {
        case '\n': out.append("\\n"); break;
        case '\t': out.append("\\t"); break;
        case '\r': out.append("\\r"); break;
        default:
          out.append("\\u00");
          out.push_back(kHex[u >> 4]);
          out.push_back(kHex[u & 0xf]);
      }
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace sbx::protocol
