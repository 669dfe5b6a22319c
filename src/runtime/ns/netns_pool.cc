#include "runtime/ns/netns_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "runtime/ns/netns.h"

namespace sbx::runtime::ns {

absl::StatusOr<UniqueFd> BuildNetns() {
  UniqueFd original(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!original) return ErrnoStatus(errno, "netns pool: open(/proc/thread-self/ns/net)");
  // Only this thread moves: a thread may unshare its network namespace on its own.
  if (::unshare(CLONE_NEWNET) != 0) return ErrnoStatus(errno, "netns pool: unshare(CLONE_NEWNET)");
  absl::Status st = absl::OkStatus();
  UniqueFd fresh(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!fresh) {
    st = ErrnoStatus(errno, "netns pool: open(/proc/thread-self/ns/net) of the new namespace");
  } else if (int stage = 0, err = PrepareSandboxNetns(&stage); err != 0) {
    st = ErrnoStatus(err, stage == 0 ? "netns pool: ioctl(lo, SIOCSIFFLAGS, IFF_UP)"
                                     : "netns pool: write(net.ipv4.ip_unprivileged_port_start, 0)");
  }
  if (::setns(original.get(), CLONE_NEWNET) != 0) {
    // This thread would stay in a sandbox's namespace: nothing it does later may rely on that.
    return ErrnoStatus(errno, "netns pool: setns back to the host network namespace");
  }
  if (!st.ok()) return st;
  return fresh;
}

NetnsPool::NetnsPool(int size) : size_(size < 0 ? 0 : size) {}

NetnsPool::~NetnsPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (filler_.joinable()) filler_.join();
}

void NetnsPool::Start() {
  std::lock_guard lock(mu_);
  if (size_ == 0 || filler_.joinable()) return;
  filler_ = std::thread([this] { FillLoop(); });
}

UniqueFd NetnsPool::Take() {
  UniqueFd fd;
  {
    std::lock_guard lock(mu_);
    if (ready_.empty()) return fd;
    fd = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_all();
  return fd;
}

int NetnsPool::ready() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(ready_.size());
}

void NetnsPool::FillLoop() {
  // Launches that a client waits for come first.
  struct sched_param param{};
  if (::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) != 0) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  }
  int failures = 0;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (static_cast<int>(ready_.size()) >= size_) {
      cv_.wait(lock);
      continue;
    }
    lock.unlock();
    auto fd = BuildNetns();
    lock.lock();
    if (!fd.ok()) {
      ++failures;
      spdlog::warn("{} (launches create their own network namespace meanwhile)",
                   std::string(fd.status().message()));
      if (fd.status().message().find("setns back") != std::string::npos) {
        // Never build again from a thread stuck in the wrong namespace.
        spdlog::error("netns pool: stopped");
        return;
      }
      cv_.wait_for(lock, std::chrono::milliseconds(std::min(30000, 500 << std::min(failures, 6))));
      continue;
    }
    failures = 0;
    ready_.push_back(std::move(*fd));
  }
}

}  // namespace sbx::runtime::ns
