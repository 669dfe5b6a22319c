#include "api/e2b/multipart.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include <fmt/format.h>

#include "common/status_util.h"

namespace sbx::api::e2b {
namespace {

constexpr size_t kMaxBoundary = 70;  // RFC 2046
// Spaces and tabs a sender may put after a delimiter before its CRLF ("transport padding").
constexpr size_t kMaxPadding = 256;

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// RFC 5987 ext-value: charset'language'pct-encoded. nullopt when malformed.
std::optional<std::string> DecodeExtValue(std::string_view v) {
  const size_t q1 = v.find('\'');
  if (q1 == std::string_view::npos) return std::nullopt;
  const size_t q2 = v.find('\'', q1 + 1);
  if (q2 == std::string_view::npos) return std::nullopt;
  const std::string_view charset = v.substr(0, q1);
  if (!IEquals(charset, "utf-8") && !IEquals(charset, "us-ascii")) return std::nullopt;
  std::string out;
  for (size_t i = q2 + 1; i < v.size(); ++i) {
    if (v[i] != '%') {
      out.push_back(v[i]);
      continue;
    }
    if (i + 2 >= v.size()) return std::nullopt;
    const int hi = HexDigit(v[i + 1]), lo = HexDigit(v[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

}  // namespace

std::optional<std::string> DispositionParam(std::string_view header, std::string_view param) {
  std::optional<std::string> plain, extended;
  const std::string ext_name = std::string(param) + "*";
  size_t i = header.find(';');
  while (i != std::string_view::npos && i < header.size()) {
    ++i;  // past ';'
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t')) ++i;
    const size_t key_end = header.find_first_of("=;", i);
    if (key_end == std::string_view::npos || header[key_end] == ';') {
      i = key_end;  // a parameter without a value: skipped
      continue;
    }
    const std::string_view key = Trim(header.substr(i, key_end - i));
    i = key_end + 1;
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t')) ++i;
    std::string value;
    if (i < header.size() && header[i] == '"') {
      ++i;
      bool closed = false;
      while (i < header.size()) {
        const char c = header[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && i < header.size()) {
          value.push_back(header[i++]);
        } else {
          value.push_back(c);
        }
      }
      if (!closed) return plain;  // unterminated: nothing after it can be trusted
      i = header.find(';', i);
    } else {
      const size_t end = header.find(';', i);
      value = std::string(Trim(header.substr(i, end == std::string_view::npos ? end : end - i)));
      i = end;
    }
    if (IEquals(key, param) && !plain) {
      plain = std::move(value);
    } else if (IEquals(key, ext_name) && !extended) {
      extended = DecodeExtValue(value);
    }
  }
  return extended ? extended : plain;
}

absl::StatusOr<std::string> MultipartBoundary(std::string_view content_type) {
  const std::string_view media = Trim(content_type.substr(0, content_type.find(';')));
  if (!IEquals(media, "multipart/form-data")) {
    return FieldError("Content-Type", fmt::format("expected multipart/form-data or "
                                                  "application/octet-stream, got \"{}\"",
                                                  std::string(media.substr(0, 100))));
  }
  auto b = DispositionParam(content_type, "boundary");
  if (!b || b->empty() || b->size() > kMaxBoundary || b->back() == ' ') {
    return FieldError("Content-Type",
                      "multipart/form-data needs a boundary parameter of 1-70 characters");
  }
  for (char c : *b) {
    if (c == '\r' || c == '\n' || c == '\0') {
      return FieldError("Content-Type", "the multipart boundary holds a control character");
    }
  }
  return *b;
}

MultipartReader::MultipartReader(std::string boundary, Limits limits)
    : delim_("\r\n--" + boundary), limits_(limits) {
  // The first delimiter may open the body without the CRLF every later one has.
  buf_ = "\r\n";
}

absl::Status MultipartReader::Fail(std::string message) {
  state_ = State::kFailed;
  error_ = ApiError(absl::StatusCode::kInvalidArgument, "invalid_argument",
                    fmt::format("multipart body: {}", message));
  return error_;
}

void MultipartReader::Feed(std::string_view bytes) {
  if (state_ == State::kEpilogue || state_ == State::kFailed) return;
  if (pos_ > 0) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

absl::Status MultipartReader::ParseHeaders(std::string_view block) {
  part_ = Part();
  std::string last_name;
  while (!block.empty()) {
    const size_t eol = block.find("\r\n");
    std::string_view line = block.substr(0, eol);
    block = eol == std::string_view::npos ? std::string_view() : block.substr(eol + 2);
    if (line.empty()) continue;
    if (line.front() == ' ' || line.front() == '\t') continue;  // obsolete folding: ignored
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return Fail(fmt::format("part {}: a header line without a name and ':'", parts_));
    }
    const std::string_view name = Trim(line.substr(0, colon));
    const std::string_view value = Trim(line.substr(colon + 1));
    if (IEquals(name, "Content-Disposition")) {
      part_.name = DispositionParam(value, "name").value_or("");
      part_.filename = DispositionParam(value, "filename");
    } else if (IEquals(name, "Content-Type")) {
      part_.content_type = std::string(value);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MultipartReader::Event> MultipartReader::Next() {
  const std::boyer_moore_horspool_searcher searcher(delim_.begin(), delim_.end());
  auto find_delim = [&]() -> size_t {
    auto it = std::search(buf_.begin() + static_cast<std::ptrdiff_t>(pos_), buf_.end(), searcher);
    return it == buf_.end() ? std::string::npos : static_cast<size_t>(it - buf_.begin());
  };
  for (;;) {
    const std::string_view rest = std::string_view(buf_).substr(pos_);
    switch (state_) {
      case State::kFailed:
        return error_;
      case State::kEpilogue:
        pos_ = buf_.size();
        return Event{Kind::kEnd, {}};
      case State::kPreamble: {
        const size_t at = find_delim();
        if (at != std::string::npos) {
          preamble_ += at - pos_;
          if (preamble_ > limits_.max_preamble_bytes) {
            return Fail(fmt::format("no boundary in the first {} bytes",
                                    limits_.max_preamble_bytes));
          }
          pos_ = at + delim_.size();
          state_ = State::kAfterDelimiter;
          continue;
        }
        const size_t keep = std::min(rest.size(), delim_.size() - 1);
        preamble_ += rest.size() - keep;
        pos_ = buf_.size() - keep;
        if (preamble_ > limits_.max_preamble_bytes) {
          return Fail(fmt::format("no boundary in the first {} bytes", limits_.max_preamble_bytes));
        }
        if (eof_) return Fail("the body holds no boundary line");
        return Event{};
      }
      case State::kAfterDelimiter: {
        if (rest.size() >= 2 && rest[0] == '-' && rest[1] == '-') {
          state_ = State::kEpilogue;
          pos_ = buf_.size();
          return Event{Kind::kEnd, {}};
        }
        size_t n = 0;
        while (n < rest.size() && (rest[n] == ' ' || rest[n] == '\t')) ++n;
        if (n > kMaxPadding) return Fail("too much padding after a boundary");
        if (rest.size() - n < 2) {
          if (rest.size() == 1 && rest[0] != '-' && rest[0] != '\r' && rest[0] != ' ' &&
              rest[0] != '\t') {
            return Fail("a boundary is followed by neither CRLF nor \"--\"");
          }
          if (eof_) return Fail("the body ended after a boundary (no closing \"--\")");
          return Event{};
        }
        if (rest[n] != '\r' || rest[n + 1] != '\n') {
          return Fail("a boundary is followed by neither CRLF nor \"--\"");
        }
        if (parts_ >= limits_.max_parts) {
          return Fail(fmt::format("more than {} parts", limits_.max_parts));
        }
        ++parts_;
        pos_ += n + 2;
        state_ = State::kHeaders;
        continue;
      }
      case State::kHeaders: {
        size_t block_end = std::string::npos, skip = 0;
        if (rest.size() >= 2 && rest[0] == '\r' && rest[1] == '\n') {
          block_end = 0;
          skip = 2;
        } else if (const size_t j = rest.find("\r\n\r\n"); j != std::string_view::npos) {
          block_end = j + 2;
          skip = j + 4;
        }
        if (block_end == std::string::npos || block_end > limits_.max_header_bytes) {
          if (rest.size() > limits_.max_header_bytes + 4 || block_end != std::string::npos) {
            return Fail(fmt::format("part {}: headers longer than {} bytes", parts_,
                                    limits_.max_header_bytes));
          }
          if (eof_) return Fail(fmt::format("part {}: the body ended in its headers", parts_));
          return Event{};
        }
        if (auto st = ParseHeaders(rest.substr(0, block_end)); !st.ok()) return st;
        pos_ += skip;
        state_ = State::kBody;
        return Event{Kind::kPart, {}};
      }
      case State::kBody: {
        const size_t at = find_delim();
        if (at == pos_) {
          pos_ += delim_.size();
          state_ = State::kAfterDelimiter;
          return Event{Kind::kPartEnd, {}};
        }
        if (at != std::string::npos) {
          const size_t from = pos_;
          pos_ = at;
          return Event{Kind::kData, std::string_view(buf_).substr(from, at - from)};
        }
        // Everything but a tail that may be the start of the delimiter.
        const size_t keep = std::min(rest.size(), delim_.size() - 1);
        if (rest.size() > keep) {
          const size_t from = pos_;
          pos_ = buf_.size() - keep;
          return Event{Kind::kData, std::string_view(buf_).substr(from, pos_ - from)};
        }
        if (eof_) return Fail(fmt::format("part {}: the body ended before its boundary", parts_));
        return Event{};
      }
    }
  }
}

}  // namespace sbx::api::e2b
