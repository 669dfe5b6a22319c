// sbx-userns-cost: what making a sandbox's user namespace costs sbxd (MakeUserNamespace: a
// holder clone, its uid and gid maps, an fd of the namespace), with sbxd's descriptor table at
// a given size. sbxd holds a few descriptors per running sandbox (pidfds, sockets, mount fds),
// so at a density of thousands its table is large, and a clone that copies the table pays for
// every entry. Prints the median and p90 per size. Numbers are reports, not assertions. Root.
//
// Usage: sbx-userns-cost [--fds 0,2000,10000,19000] [--n 200] [--owned]
//   --owned: the holder first becomes an unprivileged owner (how the ns runtime makes them).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/ns/userns.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    p = (*end == ',') ? end + 1 : end;
    if (end == p && *p != '\0') break;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {0, 2000, 10000, 19000};
  int n = 200;
  bool owned = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--fds") == 0 && i + 1 < argc) {
      sizes = ParseList(argv[++i]);
    } else if (std::strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
      n = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--owned") == 0) {
      owned = true;
    } else {
      std::fprintf(stderr, "usage: %s [--fds 0,2000,10000] [--n 200] [--owned]\n", argv[0]);
      return 2;
    }
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "sbx-userns-cost: needs root (it writes uid maps)\n");
    return 2;
  }
  // Up to the hard limit (raising it needs CAP_SYS_RESOURCE, which root may lack here).
  struct rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    std::perror("getrlimit(RLIMIT_NOFILE)");
    return 1;
  }
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    std::perror("setrlimit(RLIMIT_NOFILE)");
    return 1;
  }
  const int room = static_cast<int>(std::min<rlim_t>(rl.rlim_max, 1 << 24)) - 64;
  for (int& size : sizes) {
    if (size > room) {
      std::fprintf(stderr, "sbx-userns-cost: %d descriptors do not fit under RLIMIT_NOFILE; %d instead\n",
                   size, room);
      size = room;
    }
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    std::perror("open(/dev/null)");
    return 1;
  }
  std::vector<int> held;
  std::printf("%-10s %10s %10s\n", "fds", "p50_us", "p90_us");
  for (int size : sizes) {
    while (static_cast<int>(held.size()) < size) {
      const int fd = ::fcntl(null_fd, F_DUPFD_CLOEXEC, 3);
      if (fd < 0) {
        std::perror("fcntl(F_DUPFD_CLOEXEC)");
        return 1;
      }
      held.push_back(fd);
    }
    while (static_cast<int>(held.size()) > size) {
      ::close(held.back());
      held.pop_back();
    }
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      const uint32_t base = sbx::runtime::ns::kUidRangeFirst;
      auto ns = owned ? sbx::runtime::ns::MakeUserNamespace(
                            base, sbx::runtime::ns::kGuestUidCount, sbx::runtime::ns::AgentUidOf(base))
                      : sbx::runtime::ns::MakeUserNamespace(base);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (!ns.ok()) {
        std::fprintf(stderr, "MakeUserNamespace: %s\n", std::string(ns.status().message()).c_str());
        return 1;
      }
    }
    std::sort(us.begin(), us.end());
    std::printf("%-10d %10.1f %10.1f\n", size, us[us.size() / 2], us[us.size() * 9 / 10]);
  }
  return 0;
}
