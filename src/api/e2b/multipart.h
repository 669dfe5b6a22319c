// A streaming multipart/form-data reader (RFC 7578 / RFC 2046 §5.1) for envd's POST /files
// (e2b-compat.md §6.3): the body is fed in pieces as it arrives and read back as events (a
// part's headers, pieces of its data, its end), so a part of any size passes through in bounded
// memory: the reader holds one fed piece, at most a delimiter's length of held-back bytes and
// one part's header block. Binary-safe: only "\r\n--<boundary>" ends a part's data.
//
// Untrusted bytes: never throws, every refusal is an InvalidArgument naming what is wrong,
// bounded (boundary length, header block size, number of parts); fuzzed
// (tests/fuzz/e2b_multipart_fuzz.cc).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::api::e2b {

// The boundary parameter of a Content-Type `multipart/form-data; boundary=...` (quoted or not,
// 1-70 characters as RFC 2046 allows). InvalidArgument for another media type or no boundary.
absl::StatusOr<std::string> MultipartBoundary(std::string_view content_type);

// The value of `param` (e.g. "filename", "name") in a Content-Disposition header value
// (`form-data; name="file"; filename="/a/b"`): a quoted-string has its backslash escapes
// undone (as Go's mime.ParseMediaType, which real envd uses, does; percent escapes are left
// as they are), `param*=UTF-8''…` (RFC 5987) is percent-decoded and wins. nullopt when absent.
std::optional<std::string> DispositionParam(std::string_view disposition, std::string_view param);

class MultipartReader {
 public:
  struct Limits {
    size_t max_header_bytes = 16 << 10;  // one part's header block
    size_t max_parts = 4096;
    size_t max_preamble_bytes = 64 << 10;
  };
  struct Part {
    std::string name;                     // Content-Disposition name
    std::optional<std::string> filename;  // Content-Disposition filename
    std::string content_type;
  };
  enum class Kind {
    kNeedMore,  // feed more bytes (or Finish())
    kPart,      // a part begins: part() has its headers
    kData,      // data: a piece of the current part's bytes (possibly empty never)
    kPartEnd,   // the current part's data is complete
    kEnd,       // the closing delimiter was read; whatever follows is ignored
  };
  struct Event {
    Kind kind = Kind::kNeedMore;
    // kData: the bytes, valid until the next Feed().
    std::string_view data;
  };

  explicit MultipartReader(std::string boundary) : MultipartReader(std::move(boundary), Limits()) {}
  MultipartReader(std::string boundary, Limits limits);

  // Appends the next bytes of the body. Data views handed out before are invalid afterwards.
  void Feed(std::string_view bytes);
  // The body is complete: a body that ends before the closing delimiter is then refused.
  void Finish() { eof_ = true; }
  // The next event from what has been fed. Once an error is returned, every later call
  // returns it too.
  absl::StatusOr<Event> Next();

  const Part& part() const { return part_; }
  size_t parts() const { return parts_; }
  // Bytes held back (not yet handed out), for tests of the memory bound.
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  enum class State { kPreamble, kAfterDelimiter, kHeaders, kBody, kEpilogue, kFailed };
  absl::Status Fail(std::string message);
  absl::Status ParseHeaders(std::string_view block);

  const std::string delim_;  // "\r\n--" + boundary
  const Limits limits_;
  std::string buf_;
  size_t pos_ = 0;  // consumed bytes of buf_
  State state_ = State::kPreamble;
  bool eof_ = false;
  bool pending_end_ = false;  // kPartEnd owed before the next part or the end
  size_t parts_ = 0;
  size_t preamble_ = 0;
  Part part_;
  absl::Status error_;
};

}  // namespace sbx::api::e2b
