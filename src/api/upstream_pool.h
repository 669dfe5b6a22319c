// Idle keep-alive connections to servers in sandboxes (port exposure, port_routes.cc), by
// sandbox and port. A request through sbxd to a sandbox's server takes one when it can instead
// of dialling: a dial moves a thread into the sandbox's network namespace and back and costs
// the server an accept and, for a threaded server, a thread per request.
//
// What may be kept: a connection whose last exchange ended cleanly with a keep-alive response.
// How long: `max_idle`, shorter than common servers' own idle limits (Node's 5 s), so a server
// rarely closes a connection under a request sbxd just sent on it; Take also drops one the
// server already closed. Every connection of a sandbox is dropped when one of its jobs
// finishes (pause, suspend, delete: Forget), and all are dropped when idle for `max_idle`
// (Sweep): a kept socket holds the sandbox's network namespace, which must not outlive it.
//
// A kept connection is the socket object itself, still registered with its io_context's
// reactor: a request on the same io_context uses it as it is. Handing over a bare descriptor
// instead cost three syscalls per request (`epoll_ctl` to deregister at Put, `epoll_ctl` to
// register and `ioctl(FIONBIO)` at the next use); a request on another io_context still gets
// the descriptor moved over. A socket must not outlive its io_context, so the pool drops the
// sockets of an io_context when that io_context shuts down, whichever of the two goes first.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace sbx::api {

class UpstreamPool {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    size_t per_port = 8;      // idle connections kept per sandbox port
    size_t total = 1024;      // across all sandboxes: a bound on the descriptors held
    std::chrono::milliseconds max_idle{4000};
  };
  struct Conn {
    boost::asio::ip::tcp::socket sock;  // open
    bool ipv6 = false;
  };

  UpstreamPool() : UpstreamPool(Options{}) {}
  explicit UpstreamPool(Options o) : opts_(o) {}
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // A kept connection that is still open and idle (no byte from the server waiting), as a
  // socket of `ex`'s io_context (one kept there already when there is one), or nullopt.
  // Connections found closed or stale on the way are dropped.
  std::optional<Conn> Take(const std::string& sandbox, uint16_t port, Clock::time_point now,
                           const boost::asio::any_io_executor& ex);
  // Keeps `c` (false when full: `c` is closed). *needs_watch: true when this sandbox has no
  // watch yet; the caller then arranges for Forget to be called when one of its jobs finishes,
  // and hands over the handle of that arrangement with Watching.
  bool Put(const std::string& sandbox, uint16_t port, Conn c, Clock::time_point now,
           bool* needs_watch = nullptr);
  // The handle of `sandbox`'s watch; false when it was forgotten meanwhile (the caller then
  // cancels the watch itself).
  bool Watching(const std::string& sandbox, uint64_t handle);
  // Closes every connection kept for `sandbox`, and forgets its watch (which has fired).
  void Forget(const std::string& sandbox);
  // Closes those idle for max_idle or longer; returns when the next one will be due (nullopt:
  // none kept). The watches of sandboxes left with none go to *unwatch, for the caller to
  // cancel: a sandbox with no traffic for a while must not keep one.
  std::optional<Clock::time_point> Sweep(Clock::time_point now,
                                         std::vector<uint64_t>* unwatch = nullptr);
  // Closes every connection and returns every watch handle set (for the caller to cancel).
  std::vector<uint64_t> Clear();
  size_t size() const;
  const Options& options() const { return opts_; }

  class ShutdownHook;  // the io_context service that calls DropContext (upstream_pool.cc)

 private:
  struct Idle {
    Conn conn;
    Clock::time_point since;
    const void* home;  // the io_context the socket belongs to
  };
  using Key = std::pair<std::string, uint16_t>;

  // Closes every kept socket of the hook's io_context (it is shutting down) and forgets the
  // hook.
  void DropContext(ShutdownHook* hook);

  const Options opts_;
  mutable std::mutex mu_;
  std::map<Key, std::vector<Idle>> idle_;  // newest last
  std::map<std::string, uint64_t> watch_;   // sandbox -> handle (0: being arranged)
  size_t count_ = 0;
  std::vector<ShutdownHook*> hooks_;  // of the io_contexts whose sockets are kept here
};

// Whether a kept connection may carry a request: open, and nothing unread from the server (a
// byte before any request is a protocol error; zero bytes is its close). A non-blocking peek.
bool StillIdle(int fd);

}  // namespace sbx::api
