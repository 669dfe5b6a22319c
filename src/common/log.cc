#include "common/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/sink.h>

namespace sbx::log {

namespace {
thread_local const Scope* t_top = nullptr;
}  // namespace

struct ScopeAccess {
  static const Scope* Top() { return t_top; }
  static const Scope* Prev(const Scope* s) { return s->prev_; }
  static const Context* Ctx(const Scope* s) { return s->ctx_; }
  static std::span<const Attr> Attrs(const Scope* s) { return {s->attrs_, s->n_attrs_}; }
};

Scope::Scope(const Context* ctx, std::initializer_list<Attr> attrs)
    : ctx_(ctx), attrs_(attrs.begin()), n_attrs_(attrs.size()), prev_(t_top) {
  t_top = this;
}

Scope::~Scope() {
  if (t_top != this) {
    // Opened on another thread (a coroutine resumed elsewhere) or closed out of order: the
    // stack it belongs to would keep a pointer to this dead object. No way to continue safely.
    std::fputs("sbx: log::Scope destroyed on another thread or out of order (held across a "
               "co_await?); aborting\n",
               stderr);
    std::abort();
  }
  t_top = prev_;
}

Context Current() {
  Context out;
  std::string* fields[] = {&out.request_id, &out.tenant, &out.sandbox, &out.operation,
                           &out.session};
  for (const Scope* s = ScopeAccess::Top(); s != nullptr; s = ScopeAccess::Prev(s)) {
    const Context* c = ScopeAccess::Ctx(s);
    if (c == nullptr) continue;
    const std::string* from[] = {&c->request_id, &c->tenant, &c->sandbox, &c->operation,
                                 &c->session};
    for (size_t i = 0; i < std::size(fields); ++i) {
      if (fields[i]->empty() && !from[i]->empty()) *fields[i] = *from[i];
    }
  }
  return out;
}

namespace {

// The JSON level names are the values --log-level accepts; the text ones are spdlog's, as in
// sbxd's earlier pattern.
std::string_view LevelName(Format format, spdlog::level::level_enum level) {
  if (format == Format::kJson) {
    switch (level) {
      case spdlog::level::trace: return "trace";
      case spdlog::level::debug: return "debug";
      case spdlog::level::info: return "info";
      case spdlog::level::warn: return "warn";
      case spdlog::level::err: return "error";
      case spdlog::level::critical: return "critical";
      default: return "off";
    }
  }
  auto sv = spdlog::level::to_string_view(level);
  return std::string_view(sv.data(), sv.size());
}

// spdlog's ansicolor_sink colors.
std::string_view LevelColor(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return "\x1b[37m";
    case spdlog::level::debug: return "\x1b[36m";
    case spdlog::level::info: return "\x1b[32m";
    case spdlog::level::warn: return "\x1b[33m\x1b[1m";
    case spdlog::level::err: return "\x1b[31m\x1b[1m";
    case spdlog::level::critical: return "\x1b[1m\x1b[41m";
    default: return {};
  }
}

// Writes each record with one write(2) to an fd, unbuffered: a line is in the file (or with
// journald) when the call returns, and a crash loses nothing already logged. Formats outside
// the lock; the lock orders writes and the fd swap of Reopen().
class LineSink final : public spdlog::sinks::sink {
 public:
  LineSink(int fd, std::string path, Format format, bool color)
      : fd_(fd), path_(std::move(path)), format_(format), color_(color) {}
  ~LineSink() override {
    if (!path_.empty() && fd_ >= 0) ::close(fd_);
  }

  void log(const spdlog::details::log_msg& msg) override {
    thread_local std::string line;
    thread_local std::vector<Attr> attrs;
    line.clear();
    attrs.clear();
    // Innermost scope first: the first non-empty value of each field wins.
    std::string_view values[5];
    for (const Scope* s = ScopeAccess::Top(); s != nullptr; s = ScopeAccess::Prev(s)) {
      if (const Context* c = ScopeAccess::Ctx(s)) {
        const std::string* from[] = {&c->request_id, &c->tenant, &c->sandbox, &c->operation,
                                     &c->session};
        for (size_t i = 0; i < 5; ++i) {
          if (values[i].empty()) values[i] = *from[i];
        }
      }
      for (const Attr& a : ScopeAccess::Attrs(s)) attrs.push_back(a);
    }
    const Field fields[] = {{"request_id", values[0]},
                            {"tenant", values[1]},
                            {"sandbox", values[2]},
                            {"operation", values[3]},
                            {"session", values[4]}};
    Record r;
    r.time = msg.time;
    r.level = LevelName(format_, msg.level);
    r.msg = std::string_view(msg.payload.data(), msg.payload.size());
    // journald splits lines longer than its LineMax (48 KiB by default), which would break a
    // JSON record in two. A message that long is a whole output dump logged by mistake; its
    // start says what it was. (A cut through a UTF-8 sequence is escaped like any bad byte.)
    constexpr size_t kMaxMessage = 16 << 10;
    std::string cut;
    if (r.msg.size() > kMaxMessage) {
      cut = fmt::format("{} [{} more bytes]", r.msg.substr(0, kMaxMessage),
                        r.msg.size() - kMaxMessage);
      r.msg = cut;
    }
    r.fields = fields;
    r.attrs = attrs;
    AppendRecord(line, format_, r, color_ ? LevelColor(msg.level) : std::string_view());
    std::lock_guard lock(mu_);
    WriteAll(line);
  }

  void flush() override {}
  // The format is ours; spdlog::set_pattern must not change it.
  void set_pattern(const std::string&) override {}
  void set_formatter(std::unique_ptr<spdlog::formatter>) override {}

  void Reopen() {
    if (path_.empty()) return;
    int fd = OpenLogFile(path_);
    if (fd < 0) {
      const int err = errno;
      spdlog::error("log file {}: reopen failed: {}; still writing to the old file", path_,
                    std::strerror(err));
      return;
    }
    {
      std::lock_guard lock(mu_);
      std::swap(fd, fd_);
    }
    ::close(fd);
    spdlog::info("log file {} reopened", path_);
  }

  static int OpenLogFile(const std::string& path) {
    return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  }

 private:
  void WriteAll(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::write(fd_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // nowhere to report a failing log; drop the line
      off += static_cast<size_t>(n);
    }
  }

  std::mutex mu_;
  int fd_;
  const std::string path_;
  const Format format_;
  const bool color_;
};

std::shared_ptr<LineSink>& CurrentSink() {
  static std::shared_ptr<LineSink> sink;
  return sink;
}

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLevel(std::string_view level) {
  using L = spdlog::level::level_enum;
  static constexpr std::pair<std::string_view, L> kLevels[] = {
      {"trace", L::trace}, {"debug", L::debug},      {"info", L::info},
      {"warn", L::warn},   {"warning", L::warn},     {"error", L::err},
      {"err", L::err},     {"critical", L::critical}, {"off", L::off}};
  for (const auto& [name, l] : kLevels) {
    if (level == name) return l;
  }
  return absl::InvalidArgumentError(fmt::format(
      "log level '{}': expected trace, debug, info, warn, error, critical or off", level));
}

absl::StatusOr<Format> ParseFormat(std::string_view format, bool destination_is_tty) {
  if (format == "json") return Format::kJson;
  if (format == "text") return Format::kText;
  if (format == "auto") return destination_is_tty ? Format::kText : Format::kJson;
  return absl::InvalidArgumentError(
      fmt::format("log format '{}': expected json, text or auto", format));
}

absl::Status Init(const Options& opts) {
  auto level = ParseLevel(opts.level);
  if (!level.ok()) return level.status();
  int fd = STDERR_FILENO;
  if (!opts.file.empty()) {
    fd = LineSink::OpenLogFile(opts.file);
    if (fd < 0) {
      const int err = errno;
      return absl::InvalidArgumentError(
          fmt::format("--log-file {}: {}", opts.file, std::strerror(err)));
    }
  }
  const bool tty = ::isatty(fd) == 1;
  auto format = ParseFormat(opts.format, tty);
  if (!format.ok()) {
    if (!opts.file.empty()) ::close(fd);
    return format.status();
  }
  auto sink = std::make_shared<LineSink>(fd, opts.file, *format, tty && *format == Format::kText);
  auto logger = std::make_shared<spdlog::logger>("sbxd", sink);
  logger->set_level(*level);
  spdlog::set_default_logger(logger);
  CurrentSink() = sink;  // the logger holds it too; this is only for Reopen()
  return absl::OkStatus();
}

void Reopen() {
  if (auto& sink = CurrentSink()) sink->Reopen();
}

absl::Status SetLevel(std::string_view level) {
  auto l = ParseLevel(level);
  if (!l.ok()) return l.status();
  spdlog::set_level(*l);
  return absl::OkStatus();
}

}  // namespace sbx::log
