// Incremental parser for a text/event-stream body (the attach stream), following the WHATWG
// "event stream interpretation" rules. It is a pure byte-fed state machine so that it can be
// tested with arbitrary chunk boundaries, independent of any socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace sbx::cli {

struct SseEvent {
  std::string id;     // the stream's last event id when this event was dispatched ("" if none)
  std::string type;   // "message" when the event had no `event:` field
  std::string data;   // `data:` lines joined with '\n' (no trailing newline)
};

// An attach event as `sbx` handles it, from either form of the stream.
struct AttachEvent {
  std::string id;    // as SseEvent::id
  std::string type;  // "stdout", "stderr", "resync_required", "error", "process_exited", ...
  std::string data;  // SSE's `data:` (JSON); the output bytes themselves when `raw`
  bool raw = false;     // the binary form's stdout/stderr: no JSON and no base64 to undo
  uint64_t offset = 0;  // with `raw`: where `data` starts in its stream
};

// The media type of the attach stream's binary form (docs/api.md, "Binary form").
inline constexpr std::string_view kBinaryAttachType = "application/vnd.sbx.attach+binary";

// Incremental parser for the binary form: 24-byte big-endian headers (kind, reserved, length,
// id, offset), each followed by its payload. Output comes out raw; resync_required, error and
// process_exited with their JSON in `data`, as SSE sends it; keep-alives and kinds this client
// does not know are skipped. `id` follows SSE's rule: the last non-zero id seen.
class BinaryAttachParser {
 public:
  static constexpr size_t kHeaderBytes = 24;

  explicit BinaryAttachParser(size_t max_event_bytes = 64u << 20) : max_(max_event_bytes) {}
  // Consumes `bytes`, calling `on_event` for every event they complete, in order. The event
  // is valid during the call only: its buffers are reused for the next one, so a long stream
  // allocates nothing per event. An event larger than the bound is a protocol error (a broken
  // or hostile server); the parser must not be fed again.
  absl::Status Feed(std::string_view bytes, absl::FunctionRef<void(const AttachEvent&)> on_event);
  // The same, appending a copy of every event to `out`.
  absl::Status Feed(std::string_view bytes, std::vector<AttachEvent>* out);
  bool HasPartialEvent() const { return !buf_.empty(); }

 private:
  size_t max_;
  std::string buf_;  // the bytes of an event not complete yet
  AttachEvent ev_;   // the event handed to on_event; its id is SSE's last event id
};

class SseParser {
 public:
  // A single line longer than this, or an event whose data lines add up to more, is treated
  // as a protocol error rather than buffered without bound: a hostile or broken server must
  // not make the client use unbounded memory.
  static constexpr size_t kDefaultMaxLineBytes = 64u << 20;

  explicit SseParser(size_t max_line_bytes = kDefaultMaxLineBytes)
      : max_line_bytes_(max_line_bytes) {}

  // Consumes `bytes`, calling `on_event` for every event they complete, in order. Bytes that do
  // not complete a line are kept for the next call. The event is valid during the call only:
  // its buffers are reused, so a stream of events of hundreds of KiB (the attach stream's)
  // allocates nothing per event. `on_event` may swap the event's strings out (the parser
  // refills every field before the next call) to keep them without a copy. After an error the
  // parser must not be fed again.
  absl::Status Feed(std::string_view bytes, absl::FunctionRef<void(SseEvent&)> on_event);
  // The same, appending a copy of every event to `out`.
  absl::Status Feed(std::string_view bytes, std::vector<SseEvent>* out);

  // True when some field of an event was seen but its terminating blank line was not: the
  // stream ended in the middle of an event (which is then discarded, as the spec requires).
  bool HasPartialEvent() const { return !line_.empty() || in_data_line_ || event_started_; }

  // Number of comment lines seen (the server's ": keepalive").
  uint64_t comments() const { return comments_; }
  // The last `retry:` value, in milliseconds.
  std::optional<uint64_t> retry_ms() const { return retry_ms_; }
  const std::string& last_event_id() const { return last_event_id_; }

 private:
  void ProcessLine(std::string_view line, absl::FunctionRef<void(SseEvent&)> on_event);
  absl::Status DataTooLarge() const;

  size_t max_line_bytes_;
  std::string line_;         // bytes of the current, unterminated line
  // The current, unterminated line is a data line whose value is appended to data_ directly.
  bool in_data_line_ = false;
  size_t line_bytes_ = 0;    // length of the current, unterminated line (line_ or in data_)
  bool after_cr_ = false;    // the previous byte was a CR: a following LF belongs to it
  bool bom_checked_ = false;
  bool event_started_ = false;
  std::string data_;  // the data lines so far; swapped with ev_.data at dispatch
  SseEvent ev_;       // the event handed to on_event
  bool has_data_ = false;
  std::string type_;
  std::string last_event_id_;
  std::optional<uint64_t> retry_ms_;
  uint64_t comments_ = 0;
};

}  // namespace sbx::cli
