#include "runtime/ns/reaper.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

namespace {
constexpr std::chrono::milliseconds kMaxRetry{30000};
}  // namespace

Reaper::Reaper(size_t max_backlog, RemoveFn remove, std::chrono::milliseconds first_retry)
    : max_backlog_(max_backlog),
      remove_(remove ? std::move(remove) : RemoveFn([](const std::string& p) { return RemoveTree(p); })),
      first_retry_(first_retry) {}

Reaper::~Reaper() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Last chance before the process goes: what fails now stays for the start-up sweep.
  std::deque<Item> left;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (Item& item : left) {
    if (!Attempt(item)) {
      spdlog::error("ns: reaper: {} left for the next start-up sweep", item.path);
    }
  }
  idle_cv_.notify_all();
}

bool Reaper::Defer(std::string path, UniqueFd hold) {
  if (max_backlog_ == 0) return false;
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() + in_flight_ >= max_backlog_) return false;
    queue_.push_back(Item{std::move(path), std::move(hold), 0, std::chrono::steady_clock::now()});
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_one();
  return true;
}

size_t Reaper::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + in_flight_;
}

uint64_t Reaper::failures() const {
  std::lock_guard lock(mu_);
  return failures_;
}

bool Reaper::WaitIdle(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return queue_.empty() && in_flight_ == 0; });
}

bool Reaper::Attempt(Item& item) {
  // First: the image's loop device detaches only when its file system goes.
  item.hold.Reset();
  absl::Status st = remove_(item.path);
  if (st.ok()) return true;
  ++item.attempts;
  const auto backoff = std::min<std::chrono::milliseconds>(
      kMaxRetry, first_retry_ * (1 << std::min(item.attempts - 1, 6)));
  item.due = std::chrono::steady_clock::now() + backoff;
  {
    std::lock_guard lock(mu_);
    ++failures_;
  }
  spdlog::error("ns: reaper: removing {} failed (attempt {}; retrying in {} ms): {}", item.path,
                item.attempts, backoff.count(), std::string(st.message()));
  return false;
}

void Reaper::Loop() {
  // Deletes and launches that a client waits for come first; nice rather than SCHED_IDLE so
  // that the backlog still drains on a host that is never idle.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<Item> batch;
    auto next_due = std::chrono::steady_clock::time_point::max();
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->due <= now) {
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        next_due = std::min(next_due, it->due);
        ++it;
      }
    }
    if (batch.empty()) {
      if (next_due == std::chrono::steady_clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, next_due);
      }
      continue;
    }
    in_flight_ += batch.size();
    lock.unlock();
    std::vector<Item> failed;
    for (Item& item : batch) {
      if (!Attempt(item)) failed.push_back(std::move(item));
    }
    lock.lock();
    in_flight_ -= batch.size();
    for (Item& item : failed) queue_.push_back(std::move(item));
    if (queue_.empty() && in_flight_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace sbx::runtime::ns
