#include "api/upstream_pool.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <boost/asio/execution_context.hpp>
#include <boost/asio/query.hpp>

namespace sbx::api {

bool StillIdle(int fd) {
  char b;
  const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

namespace {

boost::asio::execution_context& ContextOf(const boost::asio::any_io_executor& ex) {
  return boost::asio::query(ex, boost::asio::execution::context);
}

}  // namespace

// One per io_context the pools keep sockets of. Its shutdown runs when the io_context is
// destroyed, before the reactor's (services shut down newest first, and this one is made after
// the first socket): the sockets go while their reactor still exists.
class UpstreamPool::ShutdownHook : public boost::asio::execution_context::service {
 public:
  using key_type = ShutdownHook;
  static inline boost::asio::execution_context::id id;
  explicit ShutdownHook(boost::asio::execution_context& ctx) : service(ctx) {}

  void Add(UpstreamPool* p) {
    std::lock_guard lock(mu_);
    pools_.push_back(p);
  }
  void Remove(UpstreamPool* p) {
    std::lock_guard lock(mu_);
    std::erase(pools_, p);
  }

 private:
  // Not under mu_ while a pool's lock is taken (Put takes the two the other way round). A pool
  // and the io_contexts it keeps sockets of are destroyed by one thread, one after the other.
  void shutdown() override {
    std::vector<UpstreamPool*> pools;
    {
      std::lock_guard lock(mu_);
      pools.swap(pools_);
    }
    for (UpstreamPool* p : pools) p->DropContext(this);
  }

  std::mutex mu_;
  std::vector<UpstreamPool*> pools_;
};

UpstreamPool::~UpstreamPool() {
  std::vector<ShutdownHook*> hooks;
  {
    std::lock_guard lock(mu_);
    hooks = hooks_;
  }
  for (ShutdownHook* h : hooks) h->Remove(this);
}

std::optional<UpstreamPool::Conn> UpstreamPool::Take(const std::string& sandbox, uint16_t port,
                                                     Clock::time_point now,
                                                     const boost::asio::any_io_executor& ex) {
  const void* want = &ContextOf(ex);
  std::vector<Idle> drop;  // closed outside the lock; allocates only when one is found dead
  std::optional<Conn> out;
  const void* home = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = idle_.find(Key(sandbox, port));
    if (it == idle_.end()) return std::nullopt;
    auto& v = it->second;
    // The newest usable one (the least likely to have been closed), or better the newest on
    // `ex`'s io_context; the unusable ones met on the way are dropped. The common case is one
    // peek at the newest and a pop_back.
    constexpr size_t kNone = static_cast<size_t>(-1);
    size_t pick = kNone, any = kNone;
    for (size_t i = v.size(); i-- > 0;) {
      if (now - v[i].since >= opts_.max_idle || !StillIdle(v[i].conn.sock.native_handle())) {
        drop.push_back(std::move(v[i]));
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
        --count_;
        if (any != kNone) --any;  // it sat above i
        continue;
      }
      if (v[i].home == want) {
        pick = i;
        break;
      }
      if (any == kNone) any = i;
    }
    if (pick == kNone) pick = any;
    if (pick != kNone) {
      out.emplace(std::move(v[pick].conn));
      home = v[pick].home;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(pick));
      --count_;
    }
    if (v.empty()) idle_.erase(it);
  }
  if (!out || home == want) return out;
  // Kept by another io_context: its descriptor moves over (deregistered there, registered
  // here).
  boost::system::error_code ec;
  const int fd = out->sock.release(ec);
  if (ec) return std::nullopt;
  Conn moved{boost::asio::ip::tcp::socket(ex), out->ipv6};
  moved.sock.assign(out->ipv6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    return std::nullopt;
  }
  return moved;
}

bool UpstreamPool::Put(const std::string& sandbox, uint16_t port, Conn c, Clock::time_point now,
                       bool* needs_watch) {
  if (needs_watch != nullptr) *needs_watch = false;
  auto& ctx = ContextOf(c.sock.get_executor());
  std::lock_guard lock(mu_);
  auto& v = idle_[Key(sandbox, port)];
  if (v.size() >= opts_.per_port || count_ >= opts_.total) {
    if (v.empty()) idle_.erase(Key(sandbox, port));
    return false;  // c closes as it goes out of scope
  }
  if (std::none_of(hooks_.begin(), hooks_.end(),
                   [&](ShutdownHook* h) { return &h->context() == &ctx; })) {
    auto& hook = boost::asio::use_service<ShutdownHook>(ctx);
    hook.Add(this);
    hooks_.push_back(&hook);
  }
  v.push_back(Idle{std::move(c), now, &ctx});
  ++count_;
  if (watch_.emplace(sandbox, 0).second && needs_watch != nullptr) *needs_watch = true;
  return true;
}

bool UpstreamPool::Watching(const std::string& sandbox, uint64_t handle) {
  std::lock_guard lock(mu_);
  auto it = watch_.find(sandbox);
  if (it == watch_.end() || it->second != 0) return false;
  it->second = handle;
  return true;
}

void UpstreamPool::Forget(const std::string& sandbox) {
  std::vector<Idle> drop;
  std::lock_guard lock(mu_);
  auto it = idle_.lower_bound(Key(sandbox, 0));
  while (it != idle_.end() && it->first.first == sandbox) {
    count_ -= it->second.size();
    for (auto& c : it->second) drop.push_back(std::move(c));
    it = idle_.erase(it);
  }
  watch_.erase(sandbox);
}

std::optional<UpstreamPool::Clock::time_point> UpstreamPool::Sweep(Clock::time_point now,
                                                                  std::vector<uint64_t>* unwatch) {
  std::vector<Idle> drop;
  std::lock_guard lock(mu_);
  std::optional<Clock::time_point> next;
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& v = it->second;
    for (auto c = v.begin(); c != v.end();) {
      if (now - c->since >= opts_.max_idle) {
        drop.push_back(std::move(*c));
        c = v.erase(c);
        --count_;
      } else {
        const auto due = c->since + opts_.max_idle;
        if (!next || due < *next) next = due;
        ++c;
      }
    }
    it = v.empty() ? idle_.erase(it) : std::next(it);
  }
  for (auto w = watch_.begin(); w != watch_.end();) {
    auto lb = idle_.lower_bound(Key(w->first, 0));
    if (lb != idle_.end() && lb->first.first == w->first) {
      ++w;
      continue;
    }
    if (unwatch != nullptr && w->second != 0) unwatch->push_back(w->second);
    w = watch_.erase(w);
  }
  return next;
}

std::vector<uint64_t> UpstreamPool::Clear() {
  std::vector<uint64_t> handles;
  std::map<Key, std::vector<Idle>> drop;
  std::lock_guard lock(mu_);
  for (const auto& [sandbox, handle] : watch_) {
    if (handle != 0) handles.push_back(handle);
  }
  watch_.clear();
  drop.swap(idle_);
  count_ = 0;
  return handles;
}

void UpstreamPool::DropContext(ShutdownHook* hook) {
  const void* home = &hook->context();
  std::vector<Idle> drop;
  std::lock_guard lock(mu_);
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& v = it->second;
    for (auto c = v.begin(); c != v.end();) {
      if (c->home == home) {
        drop.push_back(std::move(*c));
        c = v.erase(c);
        --count_;
      } else {
        ++c;
      }
    }
    it = v.empty() ? idle_.erase(it) : std::next(it);
  }
  std::erase(hooks_, hook);
}

size_t UpstreamPool::size() const {
  std::lock_guard lock(mu_);
  return count_;
}

}  // namespace sbx::api
