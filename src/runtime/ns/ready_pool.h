// ReadyPool<T>: a bounded set of kernel objects built ahead of launches by one thread at idle
// CPU priority (or nice 19, set_idle_priority), so that a launch takes one instead of building
// it while a client waits. NetnsPool, UsernsPool, DiskProvider and CgroupSetPool keep their
// objects in one.
//
// The filler builds with `make` outside the lock; on an error it backs off (0.5 s, doubling up
// to 30 s) and reports it to `on_error`, which returns false to stop the filler for good (a
// thread left in a bad state must not build again). Items still pooled at destruction are
// destroyed with the pool (their RAII owners release them).
//
// An item whose build was under way while Drain ran is destroyed, not pooled: Drain is how an
// owner drops items made for an old configuration (a disk of the old size), and one finishing
// just after must not sit in the pool in their place. `publish`, if given, runs under the lock
// just before an item is pooled (the disk pool renames its image to a visible name there), so
// anything that sees a published item also finds it in the pool.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"

namespace sbx::runtime::ns {

template <typename T>
class ReadyPool {
 public:
  using MakeFn = std::function<absl::StatusOr<T>()>;
  using ErrorFn = std::function<bool(const absl::Status&)>;
  using PublishFn = std::function<absl::Status(T&)>;

  ReadyPool(int size, MakeFn make, ErrorFn on_error, PublishFn publish = {})
      : size_(size < 0 ? 0 : size),
        make_(std::move(make)),
        on_error_(std::move(on_error)),
        publish_(std::move(publish)) {}
  ~ReadyPool() { Stop(); }
  ReadyPool(const ReadyPool&) = delete;
  ReadyPool& operator=(const ReadyPool&) = delete;

  // `first` runs on the filler thread before it lowers its priority (work a launch might
  // otherwise wait for, such as a golden image).
  void Start(std::function<void()> first = {}) {
    std::lock_guard lock(mu_);
    if (size_ == 0 || filler_.joinable()) return;
    filler_ = std::thread([this, first = std::move(first)] {
      if (first) first();
      FillLoop();
    });
  }

  // Stops and joins the filler; pooled items stay until Take or destruction.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (filler_.joinable()) filler_.join();
  }

  std::optional<T> Take() {
    std::optional<T> item;
    {
      std::lock_guard lock(mu_);
      // A take that found the pool empty counts too: launches are still coming.
      last_take_ = std::chrono::steady_clock::now();
      if (ready_.empty()) return item;
      item.emplace(std::move(ready_.front()));
      ready_.pop_front();
    }
    cv_.notify_all();
    return item;
  }

  // Everything pooled, for an owner that must release items itself before they are destroyed.
  // The filler, unless stopped, then makes new ones.
  std::deque<T> Drain() {
    std::deque<T> out;
    {
      std::lock_guard lock(mu_);
      out = std::exchange(ready_, {});
      ++generation_;
    }
    cv_.notify_all();
    return out;
  }

  // Before Start. false: nice 19 instead of SCHED_IDLE, for a filler that holds a global
  // kernel lock while it builds (cgroup_mutex): on a host whose CPUs are busy a SCHED_IDLE
  // holder would barely run, and every launch waiting for that lock with it.
  void set_idle_priority(bool idle) { idle_priority_ = idle; }
  // Before Start. Refill only once no Take came for this long: a filler that contends with
  // the launch that just took an item (the same kernel lock) would slow exactly that launch.
  void set_refill_delay(std::chrono::milliseconds d) { refill_delay_ = d; }

  int ready() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(ready_.size());
  }

 private:
  void FillLoop() {
    // Launches that a client waits for come first.
    struct sched_param param{};
    if (!idle_priority_) {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    } else if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) != 0) {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
    }
    int failures = 0;
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (static_cast<int>(ready_.size()) >= size_) {
        cv_.wait(lock);
        continue;
      }
      if (refill_delay_.count() > 0) {
        const auto quiet = last_take_ + refill_delay_;
        if (std::chrono::steady_clock::now() < quiet) {
          cv_.wait_until(lock, quiet);
          continue;
        }
      }
      const uint64_t generation = generation_;
      lock.unlock();
      absl::StatusOr<T> item = make_();
      lock.lock();
      if (item.ok() && generation != generation_) {
        // Drained while it was built: destroyed outside the lock (an unmount may take a while).
        lock.unlock();
        item = absl::AbortedError("drained");
        lock.lock();
        continue;
      }
      if (item.ok() && publish_) {
        if (absl::Status st = publish_(*item); !st.ok()) item = st;
      }
      if (!item.ok()) {
        ++failures;
        if (!on_error_(item.status())) return;
        cv_.wait_for(lock, std::chrono::milliseconds(std::min(30000, 500 << std::min(failures, 6))));
        continue;
      }
      failures = 0;
      ready_.push_back(std::move(*item));
    }
  }

  const int size_;
  const MakeFn make_;
  const ErrorFn on_error_;
  const PublishFn publish_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> ready_;
  uint64_t generation_ = 0;  // bumped by Drain
  bool stopping_ = false;
  bool idle_priority_ = true;
  std::chrono::milliseconds refill_delay_{0};
  std::chrono::steady_clock::time_point last_take_{};
  std::thread filler_;
};

}  // namespace sbx::runtime::ns
