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
// A pool may be network-ready (WarmPoolConfig::networked): its members are built with a network
// that no sandbox has claimed (runtime::SandboxSpec::network_ready) and serve only creates with
// a networked egress profile, which claim it at take (Instance::AttachEgress). A member whose
// claim was tried is never pooled again (Discard).
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
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
  bool networked = false;     // network-ready members, for networked creates only
};

// One pooled sandbox, built from the template with this digest and with these resources.
struct WarmSandbox {
  runtime::InstancePtr instance;
  std::string runtime;
  std::string template_name;
  std::string template_digest;
  runtime::Resources resources;
  bool networked = false;  // built network_ready (its pool's WarmPoolConfig::networked)
  // What else a member must match besides its digest to stay pooled: the template's start
  // command, which a re-import of the same release may change ("": the digest alone).
  std::string revision;
};

class WarmPool {
 public:
  // Builds one sandbox for `config` (a fresh id, default resources). A build refused with
  // ResourceExhausted (admission: the host is full) is no failure: the pool waits, without
  // backoff or warnings, until CapacityFreed() or kCapacityRecheck.
  using Builder = std::function<absl::StatusOr<WarmSandbox>(const WarmPoolConfig& config)>;
  // Told the id of every pooled sandbox the pool destroys (its resources are free again).
  using Released = std::function<void(const std::string& id)>;

  WarmPool(std::vector<WarmPoolConfig> configs, Builder build, Released released = nullptr);
  ~WarmPool();  // Stop()

  // Starts the refill thread (deferred until a Resize gives some pool a size when every size is
  // 0).
  void Start();
  // Stops refilling and destroys every sandbox still pooled.
  void Stop();

  // A ready sandbox of `runtime`/`template_name` built from `digest` (a revision, as
  // DrainStale's) with `resources`, or nullopt. Pooled sandboxes of another one (the template
  // changed) or other resources (the
  // deployment defaults changed), or whose agent died, are destroyed.
  // `networked`: from the network-ready pool.
  std::optional<WarmSandbox> Take(const std::string& runtime, const std::string& template_name,
                                  const std::string& digest, const runtime::Resources& resources,
                                  bool networked = false);
  // Puts back a sandbox whose hand-out could not be recorded (never one given its egress).
  void Return(WarmSandbox sb);
  // Destroys a taken sandbox that must not go back (its egress claim was tried) and gives its
  // capacity back as for the pool's own.
  void Discard(WarmSandbox sb);

  // New sizes (sbxd's configuration reload): pools not in `configs` get size 0. Sandboxes above
  // a smaller size are destroyed; a larger one is filled in the background.
  void Resize(const std::vector<WarmPoolConfig>& configs);
  // Destroys every ready sandbox; the refill rebuilds them (after the defaults they were built
  // with changed, so that the next creates do not pay for destroying them).
  void Flush();
  // A template's tag moved or went: destroys the ready sandboxes whose revision (digest, or
  // WarmSandbox::revision when set) is no longer what their pool's template resolves to
  // (`current`: nullopt when it resolves to nothing); the refill builds from the new release.
  void DrainStale(
      const std::function<std::optional<std::string>(const std::string& template_name)>& current);
  // Digest -> ready sandboxes built from it (template delete and gc keep those releases).
  std::map<std::string, int> Digests() const;

  // "runtime/template" (network-ready pools: "runtime/template/networked") -> sandboxes ready
  // now, for every pool with a size or a ready sandbox.
  std::map<std::string, int> Ready() const;
  // "runtime/template" -> the size each pool is kept at (0 for pools turned off).
  std::map<std::string, int> Sizes() const;
  struct PoolStats {
    std::string runtime;
    std::string template_name;
    int ready = 0;   // sandboxes ready now
    int target = 0;  // the size the pool is refilled to
    bool networked = false;
  };
  // Every configured pool (size > 0).
  std::vector<PoolStats> Stats() const;

  // Capacity was given back (a sandbox deleted): pools waiting for it try again now.
  void CapacityFreed();
  // How often a pool waiting for capacity looks again without being told.
  static constexpr std::chrono::seconds kCapacityRecheck{5};

 private:
  struct Pool {
    WarmPoolConfig config;
    std::deque<WarmSandbox> ready;
    int building = 0;
    int failures = 0;  // consecutive build failures (backoff)
    bool waiting_for_capacity = false;
    std::chrono::steady_clock::time_point retry_at{};
  };
  static std::string Key(const std::string& runtime, const std::string& template_name,
                         bool networked) {
    return runtime + "/" + template_name + (networked ? "/networked" : "");
  }
  static std::string Key(const WarmPoolConfig& c) {
    return Key(c.runtime, c.template_name, c.networked);
  }
  void FillLoop();
  void StartLocked();
  // Destroys outside the lock (it can take tens of ms), then tells released_.
  void DestroyAll(std::vector<WarmSandbox> doomed);

  Builder build_;
  Released released_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Entries are never erased (FillLoop keeps a pointer across a build): a pool turned off keeps
  // its entry with size 0.
  std::map<std::string, Pool> pools_;
  bool started_ = false;
  bool stopping_ = false;
  std::thread filler_;
};

}  // namespace sbx::service
