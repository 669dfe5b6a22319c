// sbx-attach-reader: measures attach throughput the way a fast client sees it.
//
// It creates a sandbox, a session `head -c N /dev/zero`, attaches over SSE and counts the
// decoded stdout bytes from the first byte to `process_exited`, checking on the way that ids
// increase by one, that offsets are contiguous, and that every byte is a zero. Then it deletes
// the sandbox and prints one JSON line. `--peer` instead times the same byte count read from
// `cat /dev/zero | head -c N` through a pipe: the yardstick of the benchmark issue.
//
// The client must never be the bottleneck (a Python client topped out at ~8 MiB/s), so the
// stream path is plain blocking sockets, a chunked-body and SSE line splitter that copies each
// byte once, a flat-object JSON reader for the `stdout` events (anything else goes through
// nlohmann) and the table-driven base64 decoder of src/common.
//
// Usage: sbx-attach-reader --url http://127.0.0.1:PORT --token T [--sandbox-template base]
//                          [--bytes N] [--runs K]
//        sbx-attach-reader --peer [--bytes N] [--runs K]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/encoding.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kRecvBuffer = 1 << 20;

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

absl::StatusOr<Endpoint> ParseUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return absl::InvalidArgumentError(fmt::format("--url {}: only http:// is supported", url));
  }
  url.remove_prefix(kScheme.size());
  if (size_t slash = url.find('/'); slash != std::string_view::npos) url = url.substr(0, slash);
  const size_t colon = url.rfind(':');
  if (colon == std::string_view::npos) {
    return absl::InvalidArgumentError(fmt::format("--url: no port in \"{}\"", url));
  }
  Endpoint ep;
  ep.host = std::string(url.substr(0, colon));
  const int port = std::atoi(std::string(url.substr(colon + 1)).c_str());
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(fmt::format("--url: bad port in \"{}\"", url));
  }
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

absl::StatusOr<sbx::UniqueFd> Connect(const Endpoint& ep) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(ep.port);
  if (::inet_pton(AF_INET, ep.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        fmt::format("connect: \"{}\" is not an IPv4 address (loopback only)", ep.host));
  }
  sbx::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return sbx::ErrnoStatus(errno, "connect: socket(AF_INET)");
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return sbx::ErrnoStatus(errno, fmt::format("connect: connect({}:{})", ep.host, ep.port));
  }
  return fd;
}

absl::Status SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sbx::ErrnoStatus(errno, "http: send(request)");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Reads the status line and headers; `rest` receives body bytes that came with them.
struct ResponseHead {
  int status = 0;
  bool chunked = false;
  std::optional<size_t> content_length;
};

absl::StatusOr<ResponseHead> ReadHead(int fd, std::string& rest) {
  std::string buf;
  char tmp[16 << 10];
  size_t end;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > (64 << 10)) return absl::DataLossError("http: response headers too large");
    ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sbx::ErrnoStatus(errno, "http: recv(headers)");
    if (n == 0) return absl::UnavailableError("http: connection closed before the headers");
    buf.append(tmp, static_cast<size_t>(n));
  }
  rest = buf.substr(end + 4);
  std::string_view head(buf.data(), end);
  ResponseHead h;
  if (head.size() < 12 || head.substr(0, 5) != "HTTP/") {
    return absl::DataLossError(fmt::format("http: bad status line: {}", head.substr(0, 80)));
  }
  h.status = std::atoi(std::string(head.substr(9, 3)).c_str());
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos) {
    pos += 2;
    size_t next = head.find("\r\n", pos);
    std::string line(head.substr(pos, next == std::string_view::npos ? head.npos : next - pos));
    pos = next;
    std::string lower = line;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower.rfind("transfer-encoding:", 0) == 0 && lower.find("chunked") != std::string::npos) {
      h.chunked = true;
    } else if (lower.rfind("content-length:", 0) == 0) {
      h.content_length = std::strtoull(line.c_str() + 15, nullptr, 10);
    }
  }
  return h;
}

// Feeds a chunked (or identity) body to `sink` without copying it into an intermediate buffer.
class BodyReader {
 public:
  explicit BodyReader(bool chunked) : chunked_(chunked) {}

  // Returns false once the final chunk was seen.
  template <typename Sink>
  absl::StatusOr<bool> Feed(std::string_view in, Sink&& sink) {
    if (!chunked_) {
      sink(in);
      return true;
    }
    while (!in.empty()) {
      if (left_ > 0) {
        const size_t take = std::min(left_, in.size());
        sink(in.substr(0, take));
        in.remove_prefix(take);
        left_ -= take;
        if (left_ == 0) skip_crlf_ = 2;
        continue;
      }
      if (skip_crlf_ > 0) {
        in.remove_prefix(1);
        --skip_crlf_;
        continue;
      }
      // Chunk-size line: hex digits, optional extensions, CRLF.
      const size_t nl = in.find('\n');
      size_line_.append(in.substr(0, nl));
      if (nl == std::string_view::npos) return true;
      in.remove_prefix(nl + 1);
      const size_t size = std::strtoull(size_line_.c_str(), nullptr, 16);
      size_line_.clear();
      if (size == 0) return false;  // trailers, if any, do not matter here
      left_ = size;
    }
    return true;
  }

 private:
  bool chunked_;
  size_t left_ = 0;
  int skip_crlf_ = 0;
  std::string size_line_;
};

struct HttpResult {
  int status = 0;
  json body;
};

// One request on a fresh connection (control plane: small bodies, speed irrelevant).
absl::StatusOr<HttpResult> Call(const Endpoint& ep, const std::string& method,
                                const std::string& path, const std::string& token,
                                const std::optional<json>& body) {
  SBX_ASSIGN_OR_RETURN(sbx::UniqueFd fd, Connect(ep));
  std::string payload = body ? body->dump() : "";
  std::string req = fmt::format(
      "{} {} HTTP/1.1\r\nHost: {}:{}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
      method, path, ep.host, ep.port, token, payload.size(), payload);
  SBX_RETURN_IF_ERROR(SendAll(fd.get(), req));
  std::string rest;
  SBX_ASSIGN_OR_RETURN(ResponseHead head, ReadHead(fd.get(), rest));
  std::string text;
  BodyReader reader(head.chunked);
  auto sink = [&](std::string_view b) { text.append(b); };
  SBX_ASSIGN_OR_RETURN(bool more, reader.Feed(rest, sink));
  char tmp[16 << 10];
  while (more && !(head.content_length && text.size() >= *head.content_length)) {
    ssize_t n = ::recv(fd.get(), tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sbx::ErrnoStatus(errno, fmt::format("http {} {}: recv", method, path));
    if (n == 0) break;
    SBX_ASSIGN_OR_RETURN(more, reader.Feed(std::string_view(tmp, static_cast<size_t>(n)), sink));
  }
  HttpResult r;
  r.status = head.status;
  r.body = json::parse(text, nullptr, false);
  if (r.status >= 300) {
    return absl::InternalError(fmt::format("http {} {}: status {}: {}", method, path, r.status,
                                           text.substr(0, 300)));
  }
  return r;
}

// Reads a flat JSON object of string / integer / literal values, enough for the output events.
// Anything else (escapes, nesting) returns false and the caller falls back to nlohmann.
bool ParseOutputData(std::string_view s, std::string_view& data_b64, uint64_t& offset) {
  bool have_data = false, have_offset = false;
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  };
  auto str = [&](std::string_view& out) {
    if (i >= s.size() || s[i] != '"') return false;
    const size_t start = ++i;
    const void* q = std::memchr(s.data() + i, '"', s.size() - i);
    if (!q) return false;
    const size_t end = static_cast<const char*>(q) - s.data();
    out = s.substr(start, end - start);
    if (out.find('\\') != std::string_view::npos) return false;
    i = end + 1;
    return true;
  };
  ws();
  if (i >= s.size() || s[i++] != '{') return false;
  for (;;) {
    ws();
    std::string_view key;
    if (!str(key)) return false;
    ws();
    if (i >= s.size() || s[i++] != ':') return false;
    ws();
    if (key == "data_b64") {
      if (!str(data_b64)) return false;
      have_data = true;
    } else if (key == "offset") {
      if (i >= s.size() || s[i] < '0' || s[i] > '9') return false;
      uint64_t v = 0;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
      offset = v;
      have_offset = true;
    } else {
      return false;
    }
    ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') return have_data && have_offset;
    return false;
  }
}

struct StreamStats {
  uint64_t bytes = 0;
  uint64_t events = 0;
  uint64_t sse_bytes = 0;  // encoded bytes of the stream body
  Clock::time_point first_byte{};
  Clock::time_point exited{};
  bool saw_exit = false;
  std::optional<int> exit_code;
};

// Splits an SSE body into events and checks each one.
class AttachChecker {
 public:
  explicit AttachChecker(StreamStats& st) : st_(st) {}

  void Feed(std::string_view in) {
    st_.sse_bytes += in.size();
    while (!in.empty() && status_.ok()) {
      const void* nl = std::memchr(in.data(), '\n', in.size());
      if (!nl) {
        line_.append(in);
        return;
      }
      const size_t len = static_cast<const char*>(nl) - in.data();
      if (line_.empty()) {
        Line(in.substr(0, len));
      } else {
        line_.append(in.substr(0, len));
        Line(line_);
        line_.clear();
      }
      in.remove_prefix(len + 1);
    }
  }

  const absl::Status& status() const { return status_; }

 private:
  void Line(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) {
      Dispatch();
      return;
    }
    if (line[0] == ':') return;
    const size_t colon = line.find(':');
    std::string_view field = line.substr(0, colon);
    std::string_view value = colon == line.npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    } else if (field == "event") {
      event_.assign(value);
    } else if (field == "id") {
      id_ = std::strtoull(std::string(value).c_str(), nullptr, 10);
    }
  }

  void Dispatch() {
    if (!has_data_) return;
    if (id_ != 0) {
      if (last_id_ != 0 && id_ != last_id_ + 1) {
        status_ = absl::DataLossError(
            fmt::format("event ids not consecutive: {} after {}", id_, last_id_));
      }
      last_id_ = id_;
    }
    if (event_ == "stdout" || event_ == "stderr") {
      std::string_view b64;
      uint64_t offset = 0;
      if (!ParseOutputData(data_, b64, offset)) {
        json j = json::parse(data_, nullptr, false);
        if (!j.is_object() || !j["data_b64"].is_string() || !j["offset"].is_number_unsigned()) {
          status_ = absl::DataLossError(fmt::format("bad {} event: {}", event_, data_.substr(0, 200)));
          return;
        }
        fallback_b64_ = j["data_b64"].get<std::string>();
        b64 = fallback_b64_;
        offset = j["offset"].get<uint64_t>();
      }
      if (!sbx::Base64DecodeTo(b64, decoded_)) {
        status_ = absl::DataLossError(fmt::format("event {}: data_b64 is not base64", id_));
      } else if (event_ == "stderr") {
        stderr_.append(decoded_.substr(0, 4096 - std::min<size_t>(4096, stderr_.size())));
      } else if (offset != st_.bytes) {
        status_ = absl::DataLossError(fmt::format("event {}: offset {} but {} bytes received",
                                                  id_, offset, st_.bytes));
      } else if (decoded_.find_first_not_of('\0') != std::string::npos) {
        status_ = absl::DataLossError(fmt::format("event {}: a non-zero byte from /dev/zero", id_));
      } else {
        if (st_.bytes == 0) st_.first_byte = Clock::now();
        st_.bytes += decoded_.size();
        ++st_.events;
      }
    } else if (event_ == "process_exited") {
      st_.exited = Clock::now();
      st_.saw_exit = true;
      json j = json::parse(data_, nullptr, false);
      if (j.is_object() && j["exit_code"].is_number_integer()) st_.exit_code = j["exit_code"].get<int>();
    } else {
      status_ = absl::DataLossError(fmt::format("unexpected {} event: {} (stderr: {})", event_,
                                                data_.substr(0, 300), stderr_));
    }
    data_.clear();
    event_.clear();
    has_data_ = false;
    id_ = 0;
  }

  StreamStats& st_;
  absl::Status status_;
  std::string line_, data_, event_, decoded_, fallback_b64_, stderr_;
  bool has_data_ = false;
  uint64_t id_ = 0, last_id_ = 0;
};

absl::StatusOr<StreamStats> Attach(const Endpoint& ep, const std::string& url,
                                   const std::string& token) {
  SBX_ASSIGN_OR_RETURN(sbx::UniqueFd fd, Connect(ep));
  std::string req = fmt::format(
      "GET {} HTTP/1.1\r\nHost: {}:{}\r\nAuthorization: Bearer {}\r\n"
      "Accept: text/event-stream\r\nConnection: close\r\n\r\n",
      url, ep.host, ep.port, token);
  SBX_RETURN_IF_ERROR(SendAll(fd.get(), req));
  std::string rest;
  SBX_ASSIGN_OR_RETURN(ResponseHead head, ReadHead(fd.get(), rest));
  if (head.status != 200) return absl::InternalError(fmt::format("attach: status {}", head.status));
  StreamStats st;
  AttachChecker checker(st);
  BodyReader body(head.chunked);
  auto sink = [&](std::string_view b) { checker.Feed(b); };
  SBX_ASSIGN_OR_RETURN(bool more, body.Feed(rest, sink));
  std::vector<char> buf(kRecvBuffer);
  while (more && !st.saw_exit && checker.status().ok()) {
    ssize_t n = ::recv(fd.get(), buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sbx::ErrnoStatus(errno, "attach: recv");
    if (n == 0) break;
    SBX_ASSIGN_OR_RETURN(more, body.Feed(std::string_view(buf.data(), static_cast<size_t>(n)), sink));
  }
  SBX_RETURN_IF_ERROR(checker.status());
  if (!st.saw_exit) return absl::DataLossError("attach: stream ended without process_exited");
  return st;
}

absl::StatusOr<json> WaitOperation(const Endpoint& ep, const std::string& token,
                                   const std::string& op_id) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    SBX_ASSIGN_OR_RETURN(HttpResult r, Call(ep, "GET", "/v1/operations/" + op_id, token, {}));
    const std::string state = r.body.value("state", "");
    if (state == "succeeded") return r.body;
    if (state == "failed") {
      return absl::InternalError(fmt::format("operation {} failed: {}", op_id, r.body.dump()));
    }
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(fmt::format("operation {} still {}", op_id, state));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

double MiBps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / (1024.0 * 1024.0) / seconds : 0;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Options {
  std::string url, token, tmpl = "base";
  uint64_t bytes = 1ull << 30;
  int runs = 1;
  bool peer = false;
};

absl::StatusOr<json> RunSbx(const Options& o) {
  SBX_ASSIGN_OR_RETURN(Endpoint ep, ParseUrl(o.url));
  SBX_ASSIGN_OR_RETURN(HttpResult created,
                       Call(ep, "POST", "/v1/sandboxes", o.token, json{{"template", o.tmpl}}));
  const std::string sandbox_id = created.body["sandbox"]["id"].get<std::string>();
  json result = {{"mode", "sse_attach"}, {"bytes", o.bytes}, {"sandbox_id", sandbox_id}};
  // Whatever happens, the sandbox goes away again.
  auto run = [&]() -> absl::Status {
    SBX_RETURN_IF_ERROR(
        WaitOperation(ep, o.token, created.body["operation"]["id"].get<std::string>()).status());
    json runs = json::array();
    std::vector<double> rates;
    for (int i = 0; i < o.runs; ++i) {
      SBX_ASSIGN_OR_RETURN(
          HttpResult ses,
          Call(ep, "POST", fmt::format("/v1/sandboxes/{}/sessions", sandbox_id), o.token,
               json{{"argv", {"head", "-c", std::to_string(o.bytes), "/dev/zero"}}}));
      const std::string url = ses.body["attach"]["url"].get<std::string>();
      const std::string attach_token = ses.body["attach"]["token"].get<std::string>();
      const auto t0 = Clock::now();
      SBX_ASSIGN_OR_RETURN(StreamStats st, Attach(ep, url, attach_token));
      if (st.bytes != o.bytes) {
        return absl::DataLossError(fmt::format("received {} of {} bytes", st.bytes, o.bytes));
      }
      if (st.exit_code != 0) return absl::InternalError("head exited with a non-zero code");
      const double secs = std::chrono::duration<double>(st.exited - st.first_byte).count();
      rates.push_back(MiBps(st.bytes, secs));
      runs.push_back({{"seconds", secs},
                      {"mib_per_s", rates.back()},
                      {"events", st.events},
                      {"avg_event_bytes", st.events ? st.bytes / st.events : 0},
                      {"sse_bytes", st.sse_bytes},
                      {"first_byte_ms",
                       std::chrono::duration<double, std::milli>(st.first_byte - t0).count()}});
    }
    result["runs"] = runs;
    result["median_mib_per_s"] = Median(rates);
    return absl::OkStatus();
  };
  absl::Status st = run();
  auto del = Call(ep, "DELETE", "/v1/sandboxes/" + sandbox_id, o.token, {});
  if (del.ok()) {
    auto op = WaitOperation(ep, o.token, del->body["operation"]["id"].get<std::string>());
    if (!op.ok() && st.ok()) st = op.status();
  } else if (st.ok()) {
    st = del.status();
  }
  if (!st.ok()) return st;
  return result;
}

// The peer: `cat /dev/zero | head -c N` read through a pipe by this process.
absl::StatusOr<json> RunPeer(const Options& o) {
  std::vector<double> rates;
  json runs = json::array();
  for (int i = 0; i < o.runs; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return sbx::ErrnoStatus(errno, "peer: pipe2");
    sbx::UniqueFd rd(fds[0]), wr(fds[1]);
    const std::string cmd = fmt::format("cat /dev/zero | head -c {}", o.bytes);
    const pid_t pid = ::fork();
    if (pid < 0) return sbx::ErrnoStatus(errno, "peer: fork");
    if (pid == 0) {
      ::dup2(wr.get(), 1);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    wr.Reset();
    std::vector<char> buf(kRecvBuffer);
    uint64_t total = 0;
    Clock::time_point first{};
    for (;;) {
      ssize_t n = ::read(rd.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (total == 0) first = Clock::now();
      total += static_cast<uint64_t>(n);
    }
    const auto end = Clock::now();
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (total != o.bytes) {
      return absl::DataLossError(fmt::format("peer: read {} of {} bytes", total, o.bytes));
    }
    const double secs = std::chrono::duration<double>(end - first).count();
    rates.push_back(MiBps(total, secs));
    runs.push_back({{"seconds", secs}, {"mib_per_s", rates.back()}});
  }
  return json{{"mode", "pipe_peer"}, {"bytes", o.bytes}, {"runs", runs},
              {"median_mib_per_s", Median(rates)}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sbx-attach-reader: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--url") {
      o.url = value();
    } else if (a == "--token") {
      o.token = value();
    } else if (a == "--sandbox-template") {
      o.tmpl = value();
    } else if (a == "--bytes") {
      o.bytes = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--runs") {
      o.runs = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--peer") {
      o.peer = true;
    } else {
      std::fprintf(stderr,
                   "usage: sbx-attach-reader --url URL --token TOKEN [--sandbox-template base] "
                   "[--bytes N] [--runs K]\n       sbx-attach-reader --peer [--bytes N] "
                   "[--runs K]\n");
      return 2;
    }
  }
  if (!o.peer && (o.url.empty() || o.token.empty())) {
    std::fprintf(stderr, "sbx-attach-reader: --url and --token are required (or --peer)\n");
    return 2;
  }
  auto r = o.peer ? RunPeer(o) : RunSbx(o);
  if (!r.ok()) {
    std::printf("%s\n", json{{"ok", false}, {"error", std::string(r.status().message())}}.dump().c_str());
    return 1;
  }
  (*r)["ok"] = true;
  std::printf("%s\n", r->dump().c_str());
  return 0;
}
