#include "api/upstream_pool.h"

#include <sys/socket.h>

#include <cerrno>

namespace sbx::api {

bool StillIdle(int fd) {
  char b;
  const ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

std::optional<UpstreamPool::Conn> UpstreamPool::Take(const std::string& sandbox, uint16_t port,
                                                     Clock::time_point now) {
  std::vector<Idle> drop;  // closed outside the lock
  std::optional<Conn> out;
  {
    std::lock_guard lock(mu_);
    auto it = idle_.find(Key(sandbox, port));
    if (it == idle_.end()) return std::nullopt;
    auto& v = it->second;
    while (!v.empty()) {
      Idle c = std::move(v.back());  // the newest: the least likely to have been closed
      v.pop_back();
      --count_;
      if (now - c.since < opts_.max_idle && StillIdle(c.conn.fd.get())) {
        out = std::move(c.conn);
        break;
      }
      drop.push_back(std::move(c));
    }
    if (v.empty()) idle_.erase(it);
  }
  return out;
}

bool UpstreamPool::Put(const std::string& sandbox, uint16_t port, Conn c, Clock::time_point now,
                       bool* needs_watch) {
  if (needs_watch != nullptr) *needs_watch = false;
  std::lock_guard lock(mu_);
  auto& v = idle_[Key(sandbox, port)];
  if (v.size() >= opts_.per_port || count_ >= opts_.total) {
    if (v.empty()) idle_.erase(Key(sandbox, port));
    return false;  // c closes as it goes out of scope
  }
  v.push_back(Idle{std::move(c), now});
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

size_t UpstreamPool::size() const {
  std::lock_guard lock(mu_);
  return count_;
}

}  // namespace sbx::api
