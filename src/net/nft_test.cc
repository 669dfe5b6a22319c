// libnftables keeps a netlink socket for a context's life; Nft must not leave it inheritable.
#include "net/nft.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>

#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

namespace sbx::net {
namespace {

// This process's netlink sockets, each with whether it is close-on-exec.
std::vector<std::pair<int, bool>> NetlinkSockets() {
  std::vector<std::pair<int, bool>> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const int fd = std::atoi(e->d_name);
    int domain = 0;
    socklen_t len = sizeof(domain);
    if (fd < 3 || fd == ::dirfd(d) ||
        ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_NETLINK) {
      continue;
    }
    out.emplace_back(fd, (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  }
  ::closedir(d);
  return out;
}

TEST(Nft, TheContextsNetlinkSocketIsCloseOnExec) {
  const size_t before = NetlinkSockets().size();
  auto nft = Nft::Open();
  ASSERT_TRUE(nft.ok()) << nft.status();
  const auto after = NetlinkSockets();
  // The library did open one (or this test would prove nothing), and every one is marked.
  EXPECT_GT(after.size(), before);
  for (const auto& [fd, cloexec] : after) EXPECT_TRUE(cloexec) << "netlink socket fd " << fd;
}

}  // namespace
}  // namespace sbx::net
