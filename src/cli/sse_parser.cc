#include "cli/sse_parser.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/byte_scan.h"

namespace sbx::cli {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";
constexpr std::string_view kDataField = "data:";

}  // namespace

absl::Status BinaryAttachParser::Feed(std::string_view bytes, std::vector<AttachEvent>* out) {
  return Feed(bytes, [out](const AttachEvent& e) { out->push_back(e); });
}

absl::Status BinaryAttachParser::Feed(std::string_view bytes,
                                      absl::FunctionRef<void(const AttachEvent&)> on_event) {
  auto be = [](const char* p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | static_cast<uint8_t>(p[i]);
    return v;
  };
  // Whole events are taken from `bytes` where they lie; only a split one is buffered.
  std::string_view in = bytes;
  for (;;) {
    if (!buf_.empty()) {
      if (buf_.size() < kHeaderBytes) {
        const size_t k = std::min(kHeaderBytes - buf_.size(), in.size());
        buf_.append(in.substr(0, k));
        in.remove_prefix(k);
        if (buf_.size() < kHeaderBytes) return absl::OkStatus();
      }
      const size_t need = kHeaderBytes + be(buf_.data() + 4, 4);
      if (need > max_) break;
      const size_t k = std::min(need - buf_.size(), in.size());
      buf_.append(in.substr(0, k));
      in.remove_prefix(k);
      if (buf_.size() < need) return absl::OkStatus();
    } else {
      if (in.empty()) return absl::OkStatus();
      if (in.size() < kHeaderBytes || in.size() < kHeaderBytes + be(in.data() + 4, 4)) {
        if (in.size() >= kHeaderBytes && kHeaderBytes + be(in.data() + 4, 4) > max_) break;
        buf_.assign(in);
        return absl::OkStatus();
      }
    }
    const std::string_view ev = buf_.empty() ? in : std::string_view(buf_);
    const size_t length = be(ev.data() + 4, 4);
    const uint8_t kind = static_cast<uint8_t>(ev[0]);
    const uint64_t id = be(ev.data() + 8, 8);
    static constexpr const char* kKinds[] = {nullptr, "stdout", "stderr", "resync_required",
                                             "error", "process_exited"};
    if (id != 0) ev_.id = std::to_string(id);
    if (kind >= 1 && kind <= 5) {
      ev_.type = kKinds[kind];
      ev_.data.assign(ev.substr(kHeaderBytes, length));
      ev_.raw = kind <= 2;
      ev_.offset = ev_.raw ? be(ev.data() + 16, 8) : 0;
      on_event(ev_);
    }
    if (buf_.empty()) {
      in.remove_prefix(kHeaderBytes + length);
    } else {
      buf_.clear();
    }
  }
  return absl::InternalError(
      fmt::format("attach: the server sent a binary event larger than {} bytes", max_));
}

absl::Status SseParser::Feed(std::string_view bytes, std::vector<SseEvent>* out) {
  return Feed(bytes, [out](const SseEvent& e) { out->push_back(e); });
}

absl::Status SseParser::Feed(std::string_view bytes,
                             absl::FunctionRef<void(SseEvent&)> on_event) {
  if (!bom_checked_) {
    // The BOM may itself be split across chunks: wait until three bytes (or a mismatch) decide.
    std::string probe = line_ + std::string(bytes.substr(0, kBom.size()));
    if (probe.size() < kBom.size() && kBom.substr(0, probe.size()) == probe) {
      line_ = std::move(probe);
      return absl::OkStatus();
    }
    bom_checked_ = true;
    if (probe.compare(0, kBom.size(), kBom) == 0) {
      size_t from_bytes = kBom.size() - line_.size();
      line_.clear();
      bytes.remove_prefix(from_bytes);
    }
  }
  size_t start = 0;
  // Jump from line end to line end (data lines run to hundreds of KiB): one scan for CR or LF,
  // reused until passed.
  const size_t n = bytes.size();
  size_t next = FindEitherByte(bytes, '\r', '\n');
  while (next < n) {
    const size_t i = next;
    const char c = bytes[i];
    next = FindEitherByte(bytes, '\r', '\n', i + 1);
    if (i > start) after_cr_ = false;  // ordinary characters came before this line end
    if (c == '\n' && after_cr_ && i == start && line_.empty() && !in_data_line_) {
      // Second half of a CRLF whose CR ended the previous line.
      after_cr_ = false;
      start = i + 1;
      continue;
    }
    after_cr_ = (c == '\r');
    if (in_data_line_) {
      // The rest of a data line whose value went straight into data_ (see below).
      data_.append(bytes.substr(start, i - start));
      data_.push_back('\n');
      in_data_line_ = false;
    } else if (line_.empty()) {
      ProcessLine(bytes.substr(start, i - start), on_event);
    } else {
      // line_ keeps its capacity: the next long line fits without a reallocation.
      line_.append(bytes.substr(start, i - start));
      ProcessLine(line_, on_event);
      line_.clear();
    }
    start = i + 1;
    if (data_.size() > max_line_bytes_) return DataTooLarge();
  }
  if (start < n) {
    const std::string_view tail = bytes.substr(start);
    after_cr_ = false;
    if (in_data_line_) {
      data_.append(tail);
      line_bytes_ += tail.size();
    } else if (line_.empty() && tail.size() > kDataField.size() &&
               tail.substr(0, kDataField.size()) == kDataField) {
      // A data line that goes on in the next read (an output event's, hundreds of KiB) is
      // appended to data_ as it comes instead of gathered in line_ and copied from there. Only
      // once the byte after "data:" is here: it decides whether a space is dropped.
      std::string_view value = tail.substr(kDataField.size());
      if (value.front() == ' ') value.remove_prefix(1);
      data_.append(value);
      event_started_ = true;
      has_data_ = true;
      in_data_line_ = true;
      line_bytes_ = tail.size();
    } else {
      line_.append(tail);
      line_bytes_ = line_.size();
    }
    if (line_bytes_ > max_line_bytes_) {
      return absl::ResourceExhaustedError(
          fmt::format("event stream: a line exceeds {} bytes", max_line_bytes_));
    }
    if (data_.size() > max_line_bytes_) return DataTooLarge();
  }
  return absl::OkStatus();
}

absl::Status SseParser::DataTooLarge() const {
  return absl::ResourceExhaustedError(
      fmt::format("event stream: an event's data lines exceed {} bytes", max_line_bytes_));
}

void SseParser::ProcessLine(std::string_view line,
                            absl::FunctionRef<void(SseEvent&)> on_event) {
  if (line.empty()) {
    event_started_ = false;
    if (!has_data_) {
      // An event without data is not dispatched; its type is forgotten, its id is kept.
      type_.clear();
      return;
    }
    ev_.id = last_event_id_;
    if (type_.empty()) {
      ev_.type = "message";
    } else {
      ev_.type.swap(type_);
    }
    if (!data_.empty() && data_.back() == '\n') data_.pop_back();
    // Swapped, not moved: both buffers keep their capacity from event to event.
    ev_.data.swap(data_);
    on_event(ev_);
    data_.clear();
    type_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') {
    ++comments_;
    return;
  }
  std::string_view field = line;
  std::string_view value;
  if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  event_started_ = true;
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    type_ = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_event_id_ = std::string(value);
  } else if (field == "retry") {
    if (!value.empty() && value.size() <= 18 &&
        value.find_first_not_of("0123456789") == std::string_view::npos) {
      retry_ms_ = std::stoull(std::string(value));
    }
  }
  // Other fields are ignored, as the spec requires.
}

}  // namespace sbx::cli
