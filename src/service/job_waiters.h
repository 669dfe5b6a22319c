// JobWaiters: long-polling readers of an operation (GET /v1/operations/{id}?wait_ms=) register
// here and are woken when a job for their sandbox finishes, instead of polling the store.
// A wake-up only says "re-read": the reader checks the operation itself and registers again if
// it is not finished, so a spurious or missed-by-design wake-up costs one store read, never a
// wrong answer.
//
// Thread safety: all methods may be called from any thread; callbacks run on the thread that
// calls Notify (an operation worker) and must only post work elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sbx::service {

class JobWaiters {
 public:
  using Wake = std::function<void()>;

  uint64_t Add(const std::string& key, Wake wake) {
    std::lock_guard lock(mu_);
    const uint64_t handle = ++next_;
    by_key_.emplace(key, std::make_pair(handle, std::move(wake)));
    return handle;
  }

  // Safe after the waiter was already woken (then it does nothing).
  void Remove(uint64_t handle) {
    std::lock_guard lock(mu_);
    for (auto it = by_key_.begin(); it != by_key_.end(); ++it) {
      if (it->second.first == handle) {
        by_key_.erase(it);
        return;
      }
    }
  }

  // Wakes (and forgets) every waiter of `key`.
  void Notify(const std::string& key) {
    std::vector<Wake> wake;
    {
      std::lock_guard lock(mu_);
      auto [b, e] = by_key_.equal_range(key);
      for (auto it = b; it != e; ++it) wake.push_back(std::move(it->second.second));
      by_key_.erase(b, e);
    }
    for (auto& w : wake) w();
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return by_key_.size();
  }

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 0;
  std::multimap<std::string, std::pair<uint64_t, Wake>> by_key_;
};

}  // namespace sbx::service
