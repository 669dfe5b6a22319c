#include "service/warm_pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace sbx::service {

WarmPool::WarmPool(std::vector<WarmPoolConfig> configs, Builder build, Released released)
    : build_(std::move(build)), released_(std::move(released)) {
  for (auto& c : configs) {
    if (c.size <= 0) continue;
    std::string key = Key(c);
    pools_[key].config = std::move(c);
  }
}

WarmPool::~WarmPool() { Stop(); }

void WarmPool::Start() {
  std::lock_guard lock(mu_);
  started_ = true;
  StartLocked();
}

void WarmPool::StartLocked() {
  if (!started_ || filler_.joinable() || stopping_) return;
  bool any = false;
  for (const auto& [key, pool] : pools_) any = any || pool.config.size > 0;
  if (any) filler_ = std::thread([this] { FillLoop(); });
}

void WarmPool::Resize(const std::vector<WarmPoolConfig>& configs) {
  std::vector<WarmSandbox> doomed;
  {
    std::lock_guard lock(mu_);
    std::map<std::string, int> sizes;
    for (const auto& c : configs) sizes[Key(c)] = std::max(0, c.size);
    for (auto& [key, pool] : pools_) {
      if (!sizes.count(key)) sizes[key] = 0;
    }
    for (const auto& c : configs) {
      std::string key = Key(c);
      if (sizes[key] > 0 && !pools_.count(key)) {
        pools_[key].config = c;
        pools_[key].config.size = 0;  // set below, with the others
      }
    }
    for (auto& [key, pool] : pools_) {
      const int size = sizes[key];
      if (pool.config.size != size) {
        spdlog::info("warm pool {}: size {} -> {}", key, pool.config.size, size);
      }
      pool.config.size = size;
      // A new size deserves a new try at once, not after a failed pool's backoff.
      pool.failures = 0;
      pool.waiting_for_capacity = false;
      pool.retry_at = {};
      while (static_cast<int>(pool.ready.size()) > size) {
        doomed.push_back(std::move(pool.ready.back()));
        pool.ready.pop_back();
      }
    }
    StartLocked();
  }
  cv_.notify_all();
  DestroyAll(std::move(doomed));
}

void WarmPool::Flush() {
  std::vector<WarmSandbox> doomed;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, pool] : pools_) {
      for (auto& sb : pool.ready) doomed.push_back(std::move(sb));
      pool.ready.clear();
    }
  }
  cv_.notify_all();
  DestroyAll(std::move(doomed));
}

void WarmPool::DrainStale(
    const std::function<std::optional<std::string>(const std::string&)>& current) {
  std::vector<WarmSandbox> doomed;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, pool] : pools_) {
      const std::optional<std::string> digest = current(pool.config.template_name);
      std::deque<WarmSandbox> keep;
      for (auto& sb : pool.ready) {
        const std::string& have = sb.revision.empty() ? sb.template_digest : sb.revision;
        if (digest && have == *digest) {
          keep.push_back(std::move(sb));
        } else {
          doomed.push_back(std::move(sb));
        }
      }
      pool.ready = std::move(keep);
    }
  }
  cv_.notify_all();
  DestroyAll(std::move(doomed));
}

std::map<std::string, int> WarmPool::Digests() const {
  std::lock_guard lock(mu_);
  std::map<std::string, int> out;
  for (const auto& [key, pool] : pools_) {
    for (const auto& sb : pool.ready) ++out[sb.template_digest];
  }
  return out;
}

void WarmPool::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (filler_.joinable()) filler_.join();
  std::vector<WarmSandbox> doomed;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, pool] : pools_) {
      for (auto& sb : pool.ready) doomed.push_back(std::move(sb));
      pool.ready.clear();
    }
  }
  DestroyAll(std::move(doomed));
}

std::optional<WarmSandbox> WarmPool::Take(const std::string& runtime,
                                          const std::string& template_name,
                                          const std::string& digest,
                                          const runtime::Resources& resources,
                                          bool networked) {
  std::vector<WarmSandbox> doomed;
  std::optional<WarmSandbox> out;
  {
    std::lock_guard lock(mu_);
    auto it = pools_.find(Key(runtime, template_name, networked));
    if (it == pools_.end()) return std::nullopt;
    auto& ready = it->second.ready;
    while (!ready.empty()) {
      WarmSandbox sb = std::move(ready.front());
      ready.pop_front();
      const std::string& have = sb.revision.empty() ? sb.template_digest : sb.revision;
      if (have == digest && sb.resources == resources && sb.instance->Alive()) {
        out = std::move(sb);
        break;
      }
      doomed.push_back(std::move(sb));
    }
  }
  cv_.notify_all();  // the pool is one short now
  if (!doomed.empty()) {
    spdlog::warn("warm pool {}/{}: dropped {} stale sandbox(es) (template or default resources "
                 "changed, or agent gone)",
                 runtime, template_name, doomed.size());
    DestroyAll(std::move(doomed));
  }
  return out;
}

void WarmPool::Return(WarmSandbox sb) {
  {
    std::lock_guard lock(mu_);
    auto it = pools_.find(Key(sb.runtime, sb.template_name, sb.networked));
    // A pool turned off meanwhile (Resize) does not take it back.
    if (it != pools_.end() && !stopping_ && it->second.config.size > 0) {
      it->second.ready.push_front(std::move(sb));
      cv_.notify_all();
      return;
    }
  }
  std::vector<WarmSandbox> doomed;
  doomed.push_back(std::move(sb));
  DestroyAll(std::move(doomed));
}

void WarmPool::Discard(WarmSandbox sb) {
  // Its pool was told it is one short at Take.
  std::vector<WarmSandbox> doomed;
  doomed.push_back(std::move(sb));
  DestroyAll(std::move(doomed));
}

std::map<std::string, int> WarmPool::Ready() const {
  std::lock_guard lock(mu_);
  std::map<std::string, int> out;
  for (const auto& [key, pool] : pools_) {
    if (pool.config.size > 0 || !pool.ready.empty()) out[key] = static_cast<int>(pool.ready.size());
  }
  return out;
}

std::map<std::string, int> WarmPool::Sizes() const {
  std::lock_guard lock(mu_);
  std::map<std::string, int> out;
  for (const auto& [key, pool] : pools_) out[key] = pool.config.size;
  return out;
}

std::vector<WarmPool::PoolStats> WarmPool::Stats() const {
  std::lock_guard lock(mu_);
  std::vector<PoolStats> out;
  for (const auto& [key, pool] : pools_) {
    out.push_back(PoolStats{pool.config.runtime, pool.config.template_name,
                            static_cast<int>(pool.ready.size()), pool.config.size,
                            pool.config.networked});
  }
  return out;
}

void WarmPool::FillLoop() {
  // Refills compete with the requests a client is waiting for (often the session that follows
  // the create that emptied a slot): run only when the CPU is otherwise idle. SCHED_IDLE where
  // allowed, else the lowest nice; both change only this thread on Linux.
  struct sched_param param{};
  if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) != 0) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  }
  std::unique_lock lock(mu_);
  while (!stopping_) {
    // The pool missing the most sandboxes, among those not backing off.
    const auto now = std::chrono::steady_clock::now();
    Pool* next = nullptr;
    int missing_most = 0;
    auto wake_at = std::chrono::steady_clock::time_point::max();
    for (auto& [key, pool] : pools_) {
      int missing = pool.config.size - static_cast<int>(pool.ready.size()) - pool.building;
      if (missing <= 0) continue;
      if (pool.retry_at > now) {
        wake_at = std::min(wake_at, pool.retry_at);
        continue;
      }
      if (missing > missing_most) {
        missing_most = missing;
        next = &pool;
      }
    }
    if (next == nullptr) {
      if (wake_at == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, wake_at);
      }
      continue;
    }
    WarmPoolConfig config = next->config;
    ++next->building;
    lock.unlock();
    auto built = build_(config);
    lock.lock();
    --next->building;
    if (!built.ok() && absl::IsResourceExhausted(built.status())) {
      // The host is full: not the pool's fault, and not worth a warning per try. The pool
      // only ever takes what is left over.
      if (!next->waiting_for_capacity) {
        spdlog::info("warm pool {}/{}: waiting for capacity ({} of {} ready): {}",
                     config.runtime, config.template_name, next->ready.size(), config.size,
                     std::string(built.status().message()));
      }
      next->waiting_for_capacity = true;
      next->retry_at = std::chrono::steady_clock::now() + kCapacityRecheck;
      continue;
    }
    next->waiting_for_capacity = false;
    if (!built.ok()) {
      ++next->failures;
      // 0.5 s, 1 s, 2 s ... 30 s: a broken runtime must not turn into a busy loop.
      auto backoff = std::chrono::milliseconds(
          std::min<int64_t>(30000, int64_t{500} << std::min(next->failures - 1, 6)));
      next->retry_at = std::chrono::steady_clock::now() + backoff;
      spdlog::warn("warm pool {}/{}: build failed ({} in a row), retrying in {} ms: {}",
                   config.runtime, config.template_name, next->failures, backoff.count(),
                   std::string(built.status().message()));
      continue;
    }
    next->failures = 0;
    // A Resize may have shrunk the pool while this one was being built.
    if (stopping_ || static_cast<int>(next->ready.size()) >= next->config.size) {
      lock.unlock();
      std::vector<WarmSandbox> doomed;
      doomed.push_back(std::move(*built));
      DestroyAll(std::move(doomed));
      lock.lock();
      continue;
    }
    next->ready.push_back(std::move(*built));
  }
}

void WarmPool::DestroyAll(std::vector<WarmSandbox> doomed) {
  bool freed = false;
  for (auto& sb : doomed) {
    if (!sb.instance) continue;
    absl::Status st = sb.instance->Destroy();
    if (!st.ok()) {
      // Its kernel objects may still hold memory: it stays held until the next start-up,
      // whose sweep removes it.
      spdlog::warn("warm pool: destroy {}: {} (the next start-up sweep retries)",
                   sb.instance->id(), std::string(st.message()));
      continue;
    }
    if (released_) released_(sb.instance->id());
    freed = true;
  }
  if (freed) CapacityFreed();
}

void WarmPool::CapacityFreed() {
  {
    std::lock_guard lock(mu_);
    bool any = false;
    for (auto& [key, pool] : pools_) {
      if (!pool.waiting_for_capacity) continue;
      pool.retry_at = {};
      any = true;
    }
    if (!any) return;
  }
  cv_.notify_all();
}

}  // namespace sbx::service
