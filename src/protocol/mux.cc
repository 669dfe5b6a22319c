#include "protocol/mux.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "common/loopback.h"
#include "common/status_util.h"

namespace sbx::protocol {
namespace {

using Clock = std::chrono::steady_clock;

void PutU16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}
void PutU32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}
uint32_t GetU32(std::string_view s) {
  return (uint32_t{static_cast<uint8_t>(s[0])} << 24) | (uint32_t{static_cast<uint8_t>(s[1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[2])} << 8) | uint32_t{static_cast<uint8_t>(s[3])};
}

// Bytes queued for the port before the pump stops reading local sockets: the port is the one
// shared resource, so one busy stream must not queue without bound in front of the others.
constexpr size_t kPortOutHigh = 1024 * 1024;
// A guest pump retries the agent's socket this long: the agent starts listening a few
// milliseconds after the pump, and a kOpen may come first.
constexpr auto kConnectRetryFor = std::chrono::seconds(10);
constexpr auto kConnectRetryEvery = std::chrono::milliseconds(10);

struct Stream {
  int fd = -1;
  std::string out;             // from the port, for the local socket
  uint32_t credit = kMuxWindow;  // bytes we may still send on the port
  uint32_t consumed = 0;       // written to the local socket since our last kWindow
  bool read_eof = false;       // the local socket ended: kEof sent
  bool peer_eof = false;       // kEof received: shut the local socket's write side once `out` is out
  bool write_shut = false;
  bool connecting = false;     // guest: a non-blocking connect in progress
  bool retry = false;          // guest: the agent's socket is not there yet
  std::string target;          // guest: a kOpen's port target (u16 port, u8 family); empty: the agent
  std::string header;          // host: what a ports.sock client sent of its target so far
  bool awaiting_target = false;  // host: a ports.sock client whose target is not complete
  bool awaiting_ack = false;     // host: its target sent, the guest's connect not yet done
  Clock::time_point retry_until{};
  Clock::time_point retry_at{};
};

// u16 port (not 0), u8 address family (4 or 6).
bool ValidPortTarget(std::string_view t) {
  if (t.size() != kMuxPortOpenBytes) return false;
  const unsigned port = (static_cast<uint8_t>(t[0]) << 8) | static_cast<uint8_t>(t[1]);
  return port != 0 && (t[2] == 4 || t[2] == 6);
}

class Pump {
 public:
  explicit Pump(const MuxPumpOptions& o) : o_(o) {}
  // A guest on vsock runs one pump per host connection: the streams of one end with it.
  ~Pump() { DropStreams(); }

  absl::Status Run() {
    ::signal(SIGPIPE, SIG_IGN);
    SetNonBlocking(o_.port_fd);
    if (o_.listen_fd >= 0) {
      SetNonBlocking(o_.listen_fd);
      AppendMuxFrame(port_out_, MuxType::kHello, 0, {});
    }
    // Accept() takes connections until EAGAIN: a blocking listener would hang the pump.
    if (o_.port_listen_fd >= 0) SetNonBlocking(o_.port_listen_fd);
    std::vector<pollfd> fds;
    std::vector<uint16_t> ids;
    for (;;) {
      fds.clear();
      ids.clear();
      short port_events = POLLIN;
      if (!port_out_.empty()) port_events |= POLLOUT;
      fds.push_back({o_.port_fd, port_events, 0});
      const bool listening = o_.listen_fd >= 0 && streams_.size() < 65535;
      if (listening) fds.push_back({o_.listen_fd, POLLIN, 0});
      const bool port_listening = o_.port_listen_fd >= 0 && streams_.size() < 65535;
      if (port_listening) fds.push_back({o_.port_listen_fd, POLLIN, 0});
      int timeout_ms = -1;
      const auto now = Clock::now();
      for (auto& [id, s] : streams_) {
        if (s.retry) {
          const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(s.retry_at - now);
          const int ms = static_cast<int>(std::max<int64_t>(0, wait.count()));
          if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
          continue;
        }
        short ev = 0;
        if (s.connecting) {
          ev = POLLOUT;
        } else if (s.awaiting_target) {
          ev = POLLIN;
        } else {
          if (!s.read_eof && s.credit > 0 && port_out_.size() < kPortOutHigh) ev |= POLLIN;
          if (!s.out.empty()) ev |= POLLOUT;
        }
        // Nothing wanted: leave it out, or a hung-up socket (which poll always reports) would
        // spin the loop until its other direction ends.
        if (ev == 0) continue;
        fds.push_back({s.fd, ev, 0});
        ids.push_back(id);
      }
      if (port_hup_ && (timeout_ms < 0 || timeout_ms > 100)) timeout_ms = 100;
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "mux pump: poll");
      }
      size_t i = 0;
      const pollfd port = fds[i++];
      if (port.revents & (POLLIN | POLLHUP | POLLERR)) {
        absl::StatusOr<bool> go_on = ReadPort(port.revents);
        if (!go_on.ok()) return go_on.status();
        if (!*go_on) return absl::OkStatus();
      }
      if ((port.revents & POLLOUT) && !port_out_.empty()) {
        absl::StatusOr<bool> go_on = WritePort();
        if (!go_on.ok()) return go_on.status();
        if (!*go_on) return absl::OkStatus();
      }
      if (listening) {
        if (fds[i++].revents & POLLIN) Accept(o_.listen_fd, false);
      }
      if (port_listening) {
        if (fds[i++].revents & POLLIN) Accept(o_.port_listen_fd, true);
      }
      for (size_t k = 0; i < fds.size(); ++i, ++k) {
        if (fds[i].revents == 0) continue;
        auto it = streams_.find(ids[k]);
        if (it == streams_.end() || it->second.fd != fds[i].fd) continue;
        Service(ids[k], it->second, fds[i].revents);
      }
      RetryConnects();
    }
  }

 private:
  static void SetNonBlocking(int fd) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  }

  // False: the port ended and this pump is done (host).
  absl::StatusOr<bool> ReadPort(short revents) {
    char buf[256 * 1024];
    const ssize_t r = ::read(o_.port_fd, buf, sizeof(buf));
    if (r > 0) {
      port_hup_ = false;
      port_in_.append(buf, static_cast<size_t>(r));
      return ParsePort();
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!(revents & (POLLHUP | POLLERR))) return true;
    } else if (r < 0 && errno != ECONNRESET && !o_.port_reconnects) {
      return ErrnoStatus(errno, "mux pump: read(port)");
    }
    if (!o_.port_reconnects) return false;
    // The guest's host end is not connected: nothing on the port means anything any more.
    if (!port_hup_) DropAll();
    port_hup_ = true;
    return true;
  }

  absl::StatusOr<bool> ParsePort() {
    size_t off = 0;
    MuxFrame f;
    for (;;) {
      auto used = ParseMuxFrame(std::string_view(port_in_).substr(off), &f);
      if (!used.ok()) {
        return Annotate(used.status(), "mux pump: the port carries no frames");
      }
      if (*used == 0) break;
      off += *used;
      OnFrame(f);
    }
    port_in_.erase(0, off);
    return true;
  }

  void OnFrame(MuxFrame& f) {
    switch (f.type) {
      case MuxType::kHello:
        // Streams of an earlier host pump: their clients are gone with it.
        DropStreams();
        return;
      case MuxType::kOpen:
        if (o_.connect_path.empty()) return;  // the host opens, never the guest
        Drop(f.stream);
        Open(f.stream, f.payload);
        return;
      default:
        break;
    }
    auto it = streams_.find(f.stream);
    // A stream this side dropped may still get what the other side sent before it knew.
    if (it == streams_.end()) return;
    Stream& s = it->second;
    switch (f.type) {
      case MuxType::kData:
        if (s.out.size() + f.payload.size() > kMuxWindow) {
          // The peer ignored the window: this stream cannot be trusted to end well.
          Reset(f.stream);
          return;
        }
        s.out += f.payload;
        if (!s.connecting && !s.retry) Flush(f.stream, s);
        return;
      case MuxType::kEof:
        s.peer_eof = true;
        if (!s.connecting && !s.retry) Flush(f.stream, s);
        return;
      case MuxType::kClose:
        Drop(f.stream);
        return;
      case MuxType::kWindow: {
        if (s.awaiting_ack) {
          Acknowledge(f.stream, s);
          return;
        }
        const uint64_t c = uint64_t{s.credit} + GetU32(f.payload);
        s.credit = static_cast<uint32_t>(std::min<uint64_t>(c, kMuxWindow));
        return;
      }
      default:
        return;
    }
  }

  // False: the port ended (host: QEMU's end closed while we wrote, as when it reads one).
  absl::StatusOr<bool> WritePort() {
    const ssize_t w = ::write(o_.port_fd, port_out_.data(), port_out_.size());
    if (w > 0) {
      port_out_.erase(0, static_cast<size_t>(w));
      return true;
    }
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (o_.port_reconnects) {
      DropAll();
      return true;
    }
    if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
    return ErrnoStatus(errno, "mux pump: write(port)");
  }

  // A connection on agent.sock opens a stream to the agent at once; one on ports.sock first
  // says which port (kMuxPortOpenBytes), then opens a stream to it.
  void Accept(int listen_fd, bool port_target) {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (streams_.size() >= 65535) {
        ::close(fd);
        return;
      }
      do {
        next_id_ = static_cast<uint16_t>(next_id_ == 65535 ? 1 : next_id_ + 1);
      } while (streams_.count(next_id_) != 0);
      Stream s;
      s.fd = fd;
      s.awaiting_target = port_target;
      streams_[next_id_] = std::move(s);
      if (!port_target) AppendMuxFrame(port_out_, MuxType::kOpen, next_id_, {});
    }
  }

  // A ports.sock client's target, byte by byte as it comes; nothing went on the port yet, so a
  // client that ends early or names no valid target is dropped here alone.
  void ReadTarget(uint16_t id, Stream& s) {
    char buf[kMuxPortOpenBytes];
    const ssize_t r = ::recv(s.fd, buf, kMuxPortOpenBytes - s.header.size(), 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
      Drop(id);
      return;
    }
    s.header.append(buf, static_cast<size_t>(r));
    if (s.header.size() < kMuxPortOpenBytes) return;
    if (!ValidPortTarget(s.header)) {
      Drop(id);
      return;
    }
    s.awaiting_target = false;
    s.awaiting_ack = true;
    AppendMuxFrame(port_out_, MuxType::kOpen, id, s.header);
  }

  // The guest connected a port stream (its first kWindow, of 0): the client learns it with one
  // byte, 1, before any data; a refused port ends the stream (kClose) and the client sees EOF.
  void Acknowledge(uint16_t id, Stream& s) {
    s.awaiting_ack = false;
    const char ok = 1;
    if (::send(s.fd, &ok, 1, MSG_NOSIGNAL) != 1) Reset(id);
  }

  // Guest: tells the host a port stream's connect completed (protocol/mux.h, kOpen).
  void Connected(uint16_t id, const Stream& s) {
    if (s.target.empty()) return;
    std::string zero;
    PutU32(zero, 0);
    AppendMuxFrame(port_out_, MuxType::kWindow, id, zero);
  }

  void Open(uint16_t id, const std::string& target) {
    Stream s;
    s.retry_until = Clock::now() + kConnectRetryFor;
    s.target = target;
    streams_[id] = std::move(s);
    Connect(id, streams_[id]);
  }

  // The guest's own loopback at the target's port: a server listening there (no retry: a port
  // nobody listens on is refused at once, as on the ns runtime).
  void ConnectPort(uint16_t id, Stream& s) {
    if (!ValidPortTarget(s.target)) {
      Reset(id);
      return;
    }
    const uint16_t port = static_cast<uint16_t>((static_cast<uint8_t>(s.target[0]) << 8) |
                                                static_cast<uint8_t>(s.target[1]));
    const bool v6 = s.target[2] == 6;
    const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Reset(id);
      return;
    }
    sockaddr_storage ss;
    const socklen_t len = LoopbackSockaddr(port, v6, &ss);
    const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
    if (rc == 0 || errno == EINPROGRESS) {
      s.fd = fd;
      s.connecting = rc != 0;
      if (!s.connecting) {
        Connected(id, s);
        Flush(id, s);
      }
      return;
    }
    ::close(fd);
    Reset(id);
  }

  void Connect(uint16_t id, Stream& s) {
    s.retry = false;
    if (!s.target.empty()) {
      ConnectPort(id, s);
      return;
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Reset(id);
      return;
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, o_.connect_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      s.fd = fd;
      Flush(id, s);
      return;
    }
    const int err = errno;
    if (err == EINPROGRESS || err == EAGAIN) {
      s.fd = fd;
      s.connecting = true;
      return;
    }
    ::close(fd);
    if ((err == ENOENT || err == ECONNREFUSED) && Clock::now() < s.retry_until) {
      s.retry = true;
      s.retry_at = Clock::now() + kConnectRetryEvery;
      return;
    }
    Reset(id);
  }

  void RetryConnects() {
    const auto now = Clock::now();
    std::vector<uint16_t> due;
    for (auto& [id, s] : streams_) {
      if (s.retry && s.retry_at <= now) due.push_back(id);
    }
    for (uint16_t id : due) {
      auto it = streams_.find(id);
      if (it != streams_.end()) Connect(id, it->second);
    }
  }

  void Service(uint16_t id, Stream& s, short revents) {
    if (s.awaiting_target) {
      ReadTarget(id, s);
      return;
    }
    if (s.connecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        Reset(id);
        return;
      }
      s.connecting = false;
      Connected(id, s);
      Flush(id, s);
      return;
    }
    if (revents & POLLOUT) {
      if (!Flush(id, s)) return;
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      if (s.read_eof || s.credit == 0) return;
      char buf[kMaxMuxPayload];
      const size_t want = std::min<size_t>(sizeof(buf), s.credit);
      const ssize_t r = ::recv(s.fd, buf, want, 0);
      if (r > 0) {
        AppendMuxFrame(port_out_, MuxType::kData, id, std::string_view(buf, static_cast<size_t>(r)));
        s.credit -= static_cast<uint32_t>(r);
        return;
      }
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (r < 0) {
        Reset(id);
        return;
      }
      s.read_eof = true;
      AppendMuxFrame(port_out_, MuxType::kEof, id, {});
      Finish(id, s);
    }
  }

  // Writes what is queued for the local socket. False when the stream is gone.
  bool Flush(uint16_t id, Stream& s) {
    while (!s.out.empty()) {
      const ssize_t w = ::send(s.fd, s.out.data(), s.out.size(), MSG_NOSIGNAL);
      if (w > 0) {
        s.out.erase(0, static_cast<size_t>(w));
        s.consumed += static_cast<uint32_t>(w);
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
      Reset(id);
      return false;
    }
    if (s.consumed > 0 && (s.out.empty() || s.consumed >= kMuxWindow / 4)) {
      std::string v;
      PutU32(v, s.consumed);
      AppendMuxFrame(port_out_, MuxType::kWindow, id, v);
      s.consumed = 0;
    }
    if (s.out.empty() && s.peer_eof && !s.write_shut) {
      ::shutdown(s.fd, SHUT_WR);
      s.write_shut = true;
    }
    return Finish(id, s);
  }

  // Both directions ended and everything was written: the stream is done on this side.
  bool Finish(uint16_t id, Stream& s) {
    if (s.read_eof && s.write_shut) {
      Drop(id);
      return false;
    }
    return true;
  }

  void Reset(uint16_t id) {
    Drop(id);
    AppendMuxFrame(port_out_, MuxType::kClose, id, {});
  }

  void Drop(uint16_t id) {
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    if (it->second.fd >= 0) ::close(it->second.fd);
    streams_.erase(it);
  }

  void DropStreams() {
    for (auto& [id, s] : streams_) {
      if (s.fd >= 0) ::close(s.fd);
    }
    streams_.clear();
  }

  // The port's other end went away: what was in flight on it meant nothing to the next one.
  void DropAll() {
    DropStreams();
    port_in_.clear();
    port_out_.clear();
  }

  const MuxPumpOptions& o_;
  std::map<uint16_t, Stream> streams_;
  std::string port_in_;
  std::string port_out_;
  uint16_t next_id_ = 0;
  bool port_hup_ = false;
};

}  // namespace

void AppendMuxFrame(std::string& out, MuxType type, uint16_t stream, std::string_view payload) {
  out.push_back(static_cast<char>(type));
  out.push_back(0);
  PutU16(out, stream);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
}

absl::StatusOr<size_t> ParseMuxFrame(std::string_view in, MuxFrame* frame) {
  if (in.size() < kMuxHeaderBytes) return size_t{0};
  const auto type = static_cast<uint8_t>(in[0]);
  if (type < static_cast<uint8_t>(MuxType::kHello) || type > static_cast<uint8_t>(MuxType::kWindow)) {
    return absl::InvalidArgumentError(fmt::format("mux frame: unknown type {}", type));
  }
  if (in[1] != 0) return absl::InvalidArgumentError("mux frame: reserved byte is not 0");
  const uint16_t stream =
      static_cast<uint16_t>((static_cast<uint8_t>(in[2]) << 8) | static_cast<uint8_t>(in[3]));
  const uint32_t len = GetU32(in.substr(4, 4));
  const auto t = static_cast<MuxType>(type);
  if (len > kMaxMuxPayload) {
    return absl::InvalidArgumentError(fmt::format("mux frame: payload of {} bytes", len));
  }
  if ((t == MuxType::kHello) != (stream == 0)) {
    return absl::InvalidArgumentError(fmt::format("mux frame: type {} on stream {}", type, stream));
  }
  const bool empty = t == MuxType::kHello || t == MuxType::kEof || t == MuxType::kClose;
  if ((empty && len != 0) || (t == MuxType::kWindow && len != 4) ||
      (t == MuxType::kData && len == 0) ||
      (t == MuxType::kOpen && len != 0 && len != kMuxPortOpenBytes)) {
    return absl::InvalidArgumentError(
        fmt::format("mux frame: type {} with a {}-byte payload", type, len));
  }
  if (in.size() < kMuxHeaderBytes + len) return size_t{0};
  frame->type = t;
  frame->stream = stream;
  frame->payload.assign(in.substr(kMuxHeaderBytes, len));
  return kMuxHeaderBytes + len;
}

absl::Status RunMuxPump(const MuxPumpOptions& opts) {
  if (opts.port_fd < 0) return absl::InvalidArgumentError("mux pump: no port");
  if (opts.port_listen_fd >= 0 && opts.listen_fd < 0) {
    return absl::InvalidArgumentError("mux pump: a ports listener without the agent's");
  }
  if ((opts.listen_fd >= 0) == !opts.connect_path.empty()) {
    return absl::InvalidArgumentError("mux pump: exactly one of a listener and a connect path");
  }
  if (opts.connect_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(fmt::format("mux pump: path {} is too long", opts.connect_path));
  }
  Pump p(opts);
  return p.Run();
}

}  // namespace sbx::protocol
