// WarmPool: sandboxes built before anyone asks for them, so that a create served from the pool
// is one store transaction instead of a launch.
//
// A pooled sandbox is an ordinary runtime instance with a fresh sandbox id, the template's
// defaults and no owner. It exists only in memory until it is taken: it is in no tenant's list
// and has no store row, so no tenant can see or reach it; after a crash the start-up sweep finds
// its kernel objects under an id the store does not know and removes them. Take() hands each
// instance out once (it leaves the pool under the lock). A background thread, at a lower CPU
// priority than request work, refills each pool to its size.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/backend.h"

namespace sbx::service {

struct WarmPoolConfig {
  std::string runtime;        // "ns"
  std::string template_name;  // "base"
  int size = 0;               // sandboxes kept ready
};

// One pooled sandbox, built from the template with this digest.
struct WarmSandbox {
  runtime::InstancePtr instance;
  std::string runtime;
  std::string template_name;
  std::string template_digest;
};

class WarmPool {
 public:
  // Builds one sandbox for `config` (a fresh id, default resources).
  using Builder = std::function<absl::StatusOr<WarmSandbox>(const WarmPoolConfig& config)>;

  WarmPool(std::vector<WarmPoolConfig> configs, Builder build);
  ~WarmPool();  // Stop()

  // Starts the refill thread (no-op when every size is 0).
  void Start();
  // Stops refilling and destroys every sandbox still pooled.
  void Stop();

  // A ready sandbox of `runtime`/`template_name` built from `digest`, or nullopt. Pooled
  // sandboxes of another digest (the template changed) or whose agent died are destroyed.
  std::optional<WarmSandbox> Take(const std::string& runtime, const std::string& template_name,
                                  const std::string& digest);
  // Puts back a sandbox whose hand-out could not be recorded.
  void Return(WarmSandbox sb);

  // "runtime/template" -> sandboxes ready now.
  std::map<std::string, int> Ready() const;
  struct PoolStats {
    std::string runtime;
    std::string template_name;
    int ready = 0;   // sandboxes ready now
    int target = 0;  // the size the pool is refilled to
  };
  // Every configured pool (size > 0).
  std::vector<PoolStats> Stats() const;

 private:
  struct Pool {
    WarmPoolConfig config;
    std::deque<WarmSandbox> ready;
    int building = 0;
    int failures = 0;  // consecutive build failures (backoff)
    std::chrono::steady_clock::time_point retry_at{};
  };
  static std::string Key(const std::string& runtime, const std::string& template_name) {
    return runtime + "/" + template_name;
  }
  void FillLoop();
  // Destroys outside the lock (it can take tens of ms).
  static void DestroyAll(std::vector<WarmSandbox> doomed);

  Builder build_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Pool> pools_;
  bool stopping_ = false;
  std::thread filler_;
};

}  // namespace sbx::service
