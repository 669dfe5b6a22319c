// sbxd's logging: spdlog for the call sites, common/log_format.h for the lines (JSON or text),
// one destination (stderr, or a file reopened on SIGHUP), and a context of ids (request,
// tenant, sandbox, operation, session) attached to every line logged on its behalf.
//
// Carrying the context. spdlog 1.10 has no MDC, and sbxd has two kinds of code:
//   * Synchronous code on a thread of its own for the duration (an operation running on an
//     OperationEngine worker, a service call made from a handler, a warm-pool build): a Scope
//     puts a Context on a thread-local stack for exactly that extent, and every line logged on
//     that thread meanwhile, including plain spdlog:: calls deep in runtime/ns, carries it.
//   * C++20 coroutines on the HTTP io_context: a coroutine may resume on another thread after
//     any co_await, and other coroutines run on this thread while it is suspended, so a
//     thread-local set across a co_await would label other requests' lines and lose its own.
//     Coroutines keep their Context as data (http::RequestContext::log) and pass it at each
//     call: SBX_LOG_INFO(ctx.log, ...) for a line, log::With(ctx.log, [&] { ... }) around a
//     synchronous call. Both open the Scope and close it before anything can suspend: With()
//     takes an ordinary lambda, in which co_await does not compile.
// A Scope that is nevertheless destroyed on another thread than the one it was opened on, or
// out of order, aborts with a message: it would leave a dangling pointer on the first thread.
//
// Cost: a line below the active level costs a level check (SBX_LOG_* evaluate nothing else;
// plain spdlog calls evaluate their arguments but do not format). Enabled lines are formatted
// into a reused thread-local buffer, without a JSON DOM, and written with one write(2).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/log_format.h"

namespace sbx::log {

// What a line is about. Empty members are left out of the line.
struct Context {
  std::string request_id;
  std::string tenant;
  std::string sandbox;
  std::string operation;
  std::string session;
};

struct Options {
  std::string format = "auto";  // json, text, or auto: text on a terminal, else json
  std::string level = "info";   // trace, debug, info, warn, error, critical, off
  std::string file;             // empty: stderr (journald under systemd)
};

// Installs sbxd's default spdlog logger. Call once at start-up, before threads log.
absl::Status Init(const Options& opts);
// Reopens the log file by name (after logrotate renamed it); a no-op on stderr. Call from the
// thread that handles SIGHUP (sigwait), never from a signal handler. Keeps the old file when
// the new one cannot be opened, and says so in the log.
void Reopen();
// Changes the active level at run time (a configuration reload).
absl::Status SetLevel(std::string_view level);
absl::StatusOr<spdlog::level::level_enum> ParseLevel(std::string_view level);
// `destination_is_tty` decides "auto".
absl::StatusOr<Format> ParseFormat(std::string_view format, bool destination_is_tty);

// Puts `ctx` on this thread's context stack until destroyed. Inner scopes win field by field.
// `ctx` must outlive the scope. Never keep one alive across a co_await (see above).
class Scope {
 public:
  explicit Scope(const Context& ctx) : Scope(&ctx, {}) {}
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  friend struct ScopeAccess;  // log.cc: the sink reads the stack
  template <typename... Args>
  friend void Event(spdlog::level::level_enum, std::initializer_list<Attr>,
                    fmt::format_string<Args...>, Args&&...);
  Scope(const Context* ctx, std::initializer_list<Attr> attrs);

  const Context* ctx_;
  const Attr* attrs_;
  size_t n_attrs_;
  const Scope* prev_;
};

// Runs `fn` (synchronously) with `ctx` in scope and returns what it returns.
template <typename Fn>
decltype(auto) With(const Context& ctx, Fn&& fn) {
  Scope scope(ctx);
  return std::forward<Fn>(fn)();
}

// The merged context of this thread's scopes: for handing to work that runs elsewhere.
Context Current();

// A line with structured attributes (JSON keys) next to its message, in the current context.
// The arguments are evaluated by the caller; nothing is formatted below the active level.
template <typename... Args>
void Event(spdlog::level::level_enum level, std::initializer_list<Attr> attrs,
           fmt::format_string<Args...> format, Args&&... args) {
  if (!spdlog::should_log(level)) return;
  Scope scope(nullptr, attrs);
  spdlog::log(level, format, std::forward<Args>(args)...);
}

}  // namespace sbx::log

// A line with an explicit context, for coroutines. Arguments are evaluated only when the level
// is enabled; they must not co_await.
#define SBX_LOG(level, ctx, ...)                          \
  do {                                                    \
    if (::spdlog::should_log(level)) {                    \
      ::sbx::log::Scope sbx_log_scope_(ctx);              \
      ::spdlog::log(level, __VA_ARGS__);                  \
    }                                                     \
  } while (0)
#define SBX_LOG_TRACE(ctx, ...) SBX_LOG(::spdlog::level::trace, ctx, __VA_ARGS__)
#define SBX_LOG_DEBUG(ctx, ...) SBX_LOG(::spdlog::level::debug, ctx, __VA_ARGS__)
#define SBX_LOG_INFO(ctx, ...) SBX_LOG(::spdlog::level::info, ctx, __VA_ARGS__)
#define SBX_LOG_WARN(ctx, ...) SBX_LOG(::spdlog::level::warn, ctx, __VA_ARGS__)
#define SBX_LOG_ERROR(ctx, ...) SBX_LOG(::spdlog::level::err, ctx, __VA_ARGS__)
