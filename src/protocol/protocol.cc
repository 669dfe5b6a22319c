#include "protocol/protocol.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "common/json_util.h"
#include "common/status_util.h"
#include "protocol/limits.h"

namespace sbx::protocol {
namespace {

void PutU16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

void PutU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

void PutU64(std::string& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

uint64_t GetBE(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

absl::StatusOr<Json> ParseObject(std::string_view payload, std::string_view what) {
  return ParseObjectPayload(payload, what);
}

absl::StatusOr<uint64_t> GetU64(const Json& j, const char* key, std::string_view what) {
  auto it = j.find(key);
  if (it == j.end()) {
    return absl::InvalidArgumentError(fmt::format("{}: missing field \"{}\"", what, key));
  }
  if (!it->is_number_unsigned()) {
    // nlohmann stores non-negative integers parsed from text as unsigned.
    return absl::InvalidArgumentError(
        fmt::format("{}: field \"{}\" must be a non-negative integer", what, key));
  }
  return it->get<uint64_t>();
}

absl::StatusOr<bool> GetOptionalBool(const Json& j, const char* key, std::string_view what) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(fmt::format("{}: field \"{}\" must be a boolean", what, key));
  }
  return it->get<bool>();
}

std::string Dump(const Json& j) {
  // replace: a string with invalid UTF-8 must not make dump() throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

struct SignalEntry {
  int number;
  const char* name;  // without the "SIG" prefix
};

constexpr std::array<SignalEntry, 30> kSignals = {{
    {SIGHUP, "HUP"},     {SIGINT, "INT"},       {SIGQUIT, "QUIT"}, {SIGILL, "ILL"},
    {SIGTRAP, "TRAP"},   {SIGABRT, "ABRT"},     {SIGBUS, "BUS"},   {SIGFPE, "FPE"},
    {SIGKILL, "KILL"},   {SIGUSR1, "USR1"},     {SIGSEGV, "SEGV"}, {SIGUSR2, "USR2"},
    {SIGPIPE, "PIPE"},   {SIGALRM, "ALRM"},     {SIGTERM, "TERM"}, {SIGCHLD, "CHLD"},
    {SIGCONT, "CONT"},   {SIGSTOP, "STOP"},     {SIGTSTP, "TSTP"}, {SIGTTIN, "TTIN"},
    {SIGTTOU, "TTOU"},   {SIGURG, "URG"},       {SIGXCPU, "XCPU"}, {SIGXFSZ, "XFSZ"},
    {SIGVTALRM, "VTALRM"}, {SIGPROF, "PROF"},   {SIGWINCH, "WINCH"}, {SIGIO, "IO"},
    {SIGPWR, "PWR"},     {SIGSYS, "SYS"},
}};

absl::StatusCode AgentCodeToStatus(std::string_view code) {
  static constexpr std::pair<std::string_view, absl::StatusCode> kCodes[] = {
      {"not_found", absl::StatusCode::kNotFound},
      {"invalid_argument", absl::StatusCode::kInvalidArgument},
      {"failed_precondition", absl::StatusCode::kFailedPrecondition},
      {"already_exists", absl::StatusCode::kAlreadyExists},
      {"permission_denied", absl::StatusCode::kPermissionDenied},
      {"resource_exhausted", absl::StatusCode::kResourceExhausted},
      {"unavailable", absl::StatusCode::kUnavailable},
      {"deadline_exceeded", absl::StatusCode::kDeadlineExceeded},
      {"unimplemented", absl::StatusCode::kUnimplemented},
      {"out_of_range", absl::StatusCode::kOutOfRange},
      {"aborted", absl::StatusCode::kAborted},
      {"cancelled", absl::StatusCode::kCancelled},
  };
  for (const auto& [name, status_code] : kCodes) {
    if (name == code) return status_code;
  }
  return absl::StatusCode::kInternal;
}

}  // namespace

absl::StatusOr<Json> ParseObjectPayload(std::string_view payload, std::string_view what) {
  auto j = ParseUntrustedJson(payload, kMaxUntrustedJsonDepth);
  if (!j.ok()) {
    absl::Status s = absl::InvalidArgumentError(
        fmt::format("{}: {}", what, std::string(j.status().message())));
    return IsJsonTooDeep(j.status()) ? WithDetail(s, kJsonTooDeepDetail, "1") : s;
  }
  if (!j->is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: JSON payload is not an object", what));
  }
  return std::move(*j);
}

std::string StringField(const Json& obj, const char* key, std::string fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool BoolField(const Json& obj, const char* key, bool fallback) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

bool ResponseOk(const Json& response) { return BoolField(response, "ok", false); }

// ---- frames ------------------------------------------------------------------------------

std::string EncodeFrame(FrameType type, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out.push_back(static_cast<char>(kVersion));
  out.push_back(static_cast<char>(type));
  PutU16(out, 0);
  out.append(payload);
  return out;
}

absl::StatusOr<std::pair<FrameType, uint32_t>> DecodeHeader(const uint8_t* header) {
  const uint32_t length = static_cast<uint32_t>(GetBE(header, 4));
  const uint8_t version = header[4];
  const uint8_t type = header[5];
  const uint16_t reserved = static_cast<uint16_t>(GetBE(header + 6, 2));
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        fmt::format("frame header: unsupported protocol version {} (expected {})", version,
                    kVersion));
  }
  if (type < static_cast<uint8_t>(FrameType::kHello) ||
      type > static_cast<uint8_t>(FrameType::kEnd)) {
    return absl::InvalidArgumentError(fmt::format("frame header: unknown frame type {}", type));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        fmt::format("frame header: reserved field is {:#06x}, must be 0", reserved));
  }
  if (length > kMaxPayload) {
    return absl::InvalidArgumentError(fmt::format(
        "frame header: payload length {} exceeds the maximum of {}", length, kMaxPayload));
  }
  return std::make_pair(static_cast<FrameType>(type), length);
}

namespace {
// Frames from here on are worth the special handling in Next() (a process list, a file chunk).
constexpr size_t kLargeFrame = 64 << 10;
}  // namespace

void FrameDecoder::Feed(std::string_view bytes) {
  // Compact before growing: drop consumed bytes once they are at least half the buffer, so
  // each byte is moved O(1) times on average and the buffer stays at most twice the live data.
  if (pos_ > 0 && pos_ * 2 >= buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::string FrameDecoder::TakeBuffered() {
  std::string rest = buf_.substr(pos_);
  buf_.clear();
  pos_ = 0;
  return rest;
}

absl::StatusOr<std::optional<Frame>> FrameDecoder::Next() {
  if (buffered() < kHeaderSize) return std::optional<Frame>();
  const auto* header = reinterpret_cast<const uint8_t*>(buf_.data() + pos_);
  // On error pos_ does not move, so every later call reports the same error: the stream is
  // dead.
  SBX_ASSIGN_OR_RETURN(auto type_and_length, DecodeHeader(header));
  if (agent_bounds_) {
    const uint32_t limit = MaxFrameBytes(type_and_length.first, guest_sized_response_);
    if (type_and_length.second > limit) {
      return ApiError(absl::StatusCode::kInternal, "bad_agent_reply",
                      fmt::format("a frame of type {} with {} payload bytes "
                                  "exceeds its limit of {}",
                                  static_cast<int>(type_and_length.first),
                                  type_and_length.second, limit));
    }
  }
  const size_t total = kHeaderSize + type_and_length.second;
  if (buffered() < total) {
    // The frame's size is known (and within its bound): one allocation for it, instead of the
    // doublings of repeated appends, which leave up to twice a large reply's size held.
    if (type_and_length.second >= kLargeFrame) buf_.reserve(pos_ + total);
    return std::optional<Frame>();
  }
  if (pos_ == 0 && buf_.size() == total && type_and_length.second >= kLargeFrame) {
    // The buffer is exactly this frame: hand it over rather than copy a large payload.
    Frame frame{type_and_length.first, std::move(buf_)};
    frame.payload.erase(0, kHeaderSize);
    buf_ = std::string();
    return std::optional<Frame>(std::move(frame));
  }
  Frame frame{type_and_length.first, buf_.substr(pos_ + kHeaderSize, type_and_length.second)};
  pos_ += total;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return std::optional<Frame>(std::move(frame));
}

// ---- payloads ----------------------------------------------------------------------------

namespace {
constexpr size_t kOutputHeader = 8 + 1 + 8;
}

std::string EncodeOutput(const OutputEvent& ev) {
  std::string out;
  out.reserve(kOutputHeader + ev.data.size());
  PutU64(out, ev.event_id);
  out.push_back(static_cast<char>(ev.stream));
  PutU64(out, ev.offset);
  out.append(ev.data);
  return out;
}

void AppendOutputFrameHeader(std::string& out, uint64_t event_id, Stream stream,
                             uint64_t offset, size_t data_size) {
  const size_t payload = kOutputHeader + data_size;
  PutU32(out, static_cast<uint32_t>(payload));
  out.push_back(static_cast<char>(kVersion));
  out.push_back(static_cast<char>(FrameType::kOutput));
  PutU16(out, 0);
  PutU64(out, event_id);
  out.push_back(static_cast<char>(stream));
  PutU64(out, offset);
}

void AppendOutputFrame(std::string& out, uint64_t event_id, Stream stream, uint64_t offset,
                       std::string_view data) {
  // Geometric growth: `out` collects many frames, and an exact reserve per frame would copy
  // everything queued before it each time.
  const size_t need = out.size() + kHeaderSize + kOutputHeader + data.size();
  if (out.capacity() < need) out.reserve(std::max(need, 2 * out.capacity()));
  AppendOutputFrameHeader(out, event_id, stream, offset, data.size());
  out.append(data);
}

absl::StatusOr<OutputEventView> DecodeOutputView(std::string_view payload) {
  if (payload.size() < kOutputHeader) {
    return absl::InvalidArgumentError(fmt::format(
        "output event: payload of {} bytes is shorter than the {}-byte header", payload.size(),
        kOutputHeader));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  OutputEventView ev;
  ev.event_id = GetBE(p, 8);
  const uint8_t stream = p[8];
  if (stream != static_cast<uint8_t>(Stream::kStdout) &&
      stream != static_cast<uint8_t>(Stream::kStderr)) {
    return absl::InvalidArgumentError(fmt::format("output event: unknown stream {}", stream));
  }
  ev.stream = static_cast<Stream>(stream);
  ev.offset = GetBE(p + 9, 8);
  ev.data = payload.substr(kOutputHeader);
  return ev;
}

absl::StatusOr<OutputEvent> DecodeOutput(std::string_view payload) {
  SBX_ASSIGN_OR_RETURN(OutputEventView v, DecodeOutputView(payload));
  return OutputEvent{v.event_id, v.stream, v.offset, std::string(v.data)};
}

std::string EncodeExit(const ExitEvent& ev) {
  Json j = {{"event_id", ev.event_id},
            {"exit_code", nullptr},
            {"signal", nullptr},
            {"timed_out", ev.timed_out},
            {"oom_killed", ev.oom_killed}};
  if (ev.exit_code) j["exit_code"] = *ev.exit_code;
  if (ev.signal) j["signal"] = *ev.signal;
  return Dump(j);
}

absl::StatusOr<ExitEvent> DecodeExit(std::string_view payload) {
  constexpr std::string_view kWhat = "exit event";
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(payload, kWhat));
  ExitEvent ev;
  SBX_ASSIGN_OR_RETURN(ev.event_id, GetU64(j, "event_id", kWhat));
  if (auto it = j.find("exit_code"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError("exit event: field \"exit_code\" must be an integer");
    }
    const int64_t code = it->get<int64_t>();
    if (code < INT32_MIN || code > INT32_MAX) {
      return absl::InvalidArgumentError("exit event: field \"exit_code\" is out of range");
    }
    ev.exit_code = static_cast<int>(code);
  }
  if (auto it = j.find("signal"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError("exit event: field \"signal\" must be a string");
    }
    ev.signal = it->get<std::string>();
  }
  SBX_ASSIGN_OR_RETURN(ev.timed_out, GetOptionalBool(j, "timed_out", kWhat));
  SBX_ASSIGN_OR_RETURN(ev.oom_killed, GetOptionalBool(j, "oom_killed", kWhat));
  return ev;
}

std::string EncodeResync(const ResyncEvent& ev) {
  return Dump(Json{{"oldest_available_id", ev.oldest_available_id},
                   {"stdout_offset", ev.stdout_offset},
                   {"stderr_offset", ev.stderr_offset}});
}

absl::StatusOr<ResyncEvent> DecodeResync(std::string_view payload) {
  constexpr std::string_view kWhat = "resync event";
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(payload, kWhat));
  ResyncEvent ev;
  SBX_ASSIGN_OR_RETURN(ev.oldest_available_id, GetU64(j, "oldest_available_id", kWhat));
  SBX_ASSIGN_OR_RETURN(ev.stdout_offset, GetU64(j, "stdout_offset", kWhat));
  SBX_ASSIGN_OR_RETURN(ev.stderr_offset, GetU64(j, "stderr_offset", kWhat));
  return ev;
}

// ---- signals -----------------------------------------------------------------------------

std::optional<std::string> SignalName(int signo) {
  for (const auto& s : kSignals) {
    if (s.number == signo) return fmt::format("SIG{}", s.name);
  }
  return std::nullopt;
}

std::optional<int> SignalNumber(std::string_view name) {
  auto upper = [](std::string_view in) {
    std::string out(in);
    for (char& c : out) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
    return out;
  };
  std::string n = upper(name);
  std::string_view bare = n;
  if (bare.size() > 3 && bare.substr(0, 3) == "SIG") bare.remove_prefix(3);
  for (const auto& s : kSignals) {
    if (bare == s.name) return s.number;
  }
  return std::nullopt;
}

// ---- AgentConnection ---------------------------------------------------------------------

absl::StatusOr<AgentConnection> AgentConnection::Connect(const std::string& socket_path,
                                                         int timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(fmt::format(
        "connect to agent: socket path \"{}\" is empty or longer than {} bytes", socket_path,
        sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());

  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "connect to agent: socket(AF_UNIX)");
  AgentConnection conn(fd);

  if (timeout_ms > 0) {
    timeval tv{};
    tv.tv_sec = timeout_ms / 1000;
    tv.tv_usec = (timeout_ms % 1000) * 1000;
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
      return ErrnoStatus(errno, "connect to agent: setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)");
    }
  }
  // A blocking unix-socket connect waits for backlog space bounded by SO_SNDTIMEO.
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EISCONN) break;
    if (err == EAGAIN || err == EINPROGRESS) {
      return absl::DeadlineExceededError(
          fmt::format("connect to agent: connect({}): timed out after {} ms", socket_path,
                      timeout_ms));
    }
    return ErrnoStatus(err, fmt::format("connect to agent: connect({})", socket_path));
  }
  return conn;
}

AgentConnection::AgentConnection(AgentConnection&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), decoder_(std::move(o.decoder_)) {}

AgentConnection& AgentConnection::operator=(AgentConnection&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    decoder_ = std::move(o.decoder_);
  }
  return *this;
}

AgentConnection::~AgentConnection() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ReplyStatus(const Json& j, std::string_view what) {
  auto ok = j.find("ok");
  if (ok == j.end() || !ok->is_boolean()) {
    return absl::InternalError(fmt::format("{}: reply has no boolean \"ok\" field", what));
  }
  if (ok->get<bool>()) return absl::OkStatus();
  std::string code = "internal";
  std::string message;
  if (auto err = j.find("error"); err != j.end() && err->is_object()) {
    if (auto c = err->find("code"); c != err->end() && c->is_string()) code = c->get<std::string>();
    if (auto m = err->find("message"); m != err->end() && m->is_string()) message = m->get<std::string>();
  }
  return absl::Status(AgentCodeToStatus(code), fmt::format("agent: {}: {}", code, message));
}

absl::StatusOr<Json> AgentConnection::Call(const Json& request) {
  if (fd_ < 0) return absl::FailedPreconditionError("agent call: connection is closed");
  decoder_.LimitToAgentBounds(IsGuestSizedOp(StringField(request, "op")));
  std::string out = EncodeFrame(FrameType::kHello, Dump(Json{{"version", kVersion},
                                                             {"role", "host"}}));
  out += EncodeFrame(FrameType::kRequest, Dump(request));
  size_t sent = 0;
  while (sent < out.size()) {
    ssize_t n = ::send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        return absl::DeadlineExceededError("agent call: send: timed out");
      }
      return ErrnoStatus(err, "agent call: send(request)");
    }
    sent += static_cast<size_t>(n);
  }

  SBX_ASSIGN_OR_RETURN(Frame hello, ReadFrame());
  if (hello.type != FrameType::kHello) {
    return absl::InternalError(fmt::format("agent call: expected a hello frame, got type {}",
                                           static_cast<int>(hello.type)));
  }
  SBX_ASSIGN_OR_RETURN(Json hello_json, ParseObject(hello.payload, "agent hello"));
  (void)hello_json;

  SBX_ASSIGN_OR_RETURN(Frame resp, ReadFrame());
  if (resp.type != FrameType::kResponse) {
    return absl::InternalError(fmt::format("agent call: expected a response frame, got type {}",
                                           static_cast<int>(resp.type)));
  }
  SBX_ASSIGN_OR_RETURN(Json j, ParseObject(resp.payload, "agent response"));
  SBX_RETURN_IF_ERROR(ReplyStatus(j, "agent call"));
  return j;
}

absl::StatusOr<Frame> AgentConnection::ReadFrame() {
  if (fd_ < 0) return absl::FailedPreconditionError("agent read: connection is closed");
  char buf[64 * 1024];
  for (;;) {
    SBX_ASSIGN_OR_RETURN(std::optional<Frame> frame, decoder_.Next());
    if (frame) return std::move(*frame);
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        return absl::DeadlineExceededError("agent read: recv: timed out");
      }
      return ErrnoStatus(err, "agent read: recv");
    }
    if (n == 0) {
      if (decoder_.buffered() > 0) {
        return absl::UnavailableError(fmt::format(
            "agent closed the stream in the middle of a frame ({} bytes buffered)",
            decoder_.buffered()));
      }
      return absl::UnavailableError("agent closed the stream");
    }
    decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

absl::StatusOr<Json> CallAgent(const std::string& socket_path, const Json& request,
                               int timeout_ms) {
  SBX_ASSIGN_OR_RETURN(AgentConnection conn, AgentConnection::Connect(socket_path, timeout_ms));
  return conn.Call(request);
}

namespace {
constexpr std::pair<absl::StatusCode, std::string_view> kErrorCodeNames[] = {
    {absl::StatusCode::kNotFound, "not_found"},
    {absl::StatusCode::kInvalidArgument, "invalid_argument"},
    {absl::StatusCode::kFailedPrecondition, "failed_precondition"},
    {absl::StatusCode::kAlreadyExists, "already_exists"},
    {absl::StatusCode::kPermissionDenied, "permission_denied"},
    {absl::StatusCode::kResourceExhausted, "resource_exhausted"},
    {absl::StatusCode::kOutOfRange, "out_of_range"},
    {absl::StatusCode::kUnavailable, "unavailable"},
    {absl::StatusCode::kDeadlineExceeded, "deadline_exceeded"},
    {absl::StatusCode::kAborted, "aborted"},
    {absl::StatusCode::kUnimplemented, "unimplemented"},
};
}  // namespace

std::string ErrorCodeName(absl::StatusCode code) {
  for (const auto& [c, name] : kErrorCodeNames) {
    if (c == code) return std::string(name);
  }
  return "internal";
}

absl::StatusCode ErrorCodeFromName(std::string_view name) {
  for (const auto& [c, n] : kErrorCodeNames) {
    if (n == name) return c;
  }
  return absl::StatusCode::kInternal;
}

}  // namespace sbx::protocol
