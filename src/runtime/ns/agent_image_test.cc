#include "runtime/ns/agent_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace sbx::runtime::ns {
namespace {

std::string ReadAll(int fd, size_t size) {
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, out.data() + got, size - got, static_cast<off_t>(got));
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

// Loaded many times in a row so the pages of one load are often still in another CPU's LRU
// batch when it is sealed: the case CI hit, where sealing failed with EBUSY.
TEST(AgentImageTest, LoadsSealedCopiesEveryTime) {
  std::ifstream in("/bin/true", std::ios::binary);
  const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(want.empty());
  for (int i = 0; i < 200; ++i) {
    auto image = AgentImage::Load("/bin/true");
    ASSERT_TRUE(image.ok()) << "load " << i << ": " << image.status();
    EXPECT_EQ(image->size(), want.size());
    int seals = ::fcntl(image->fd(), F_GET_SEALS);
    ASSERT_GE(seals, 0);
    EXPECT_TRUE(seals & F_SEAL_SHRINK);
    EXPECT_TRUE(seals & F_SEAL_GROW);
    EXPECT_TRUE(seals & F_SEAL_SEAL);
    EXPECT_TRUE(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) << "seals " << seals;
    if (i % 50 == 0) {
      EXPECT_EQ(ReadAll(image->fd(), image->size()), want);
    }
  }
}

TEST(AgentImageTest, SealedImageRefusesWritesResizesAndWritableMaps) {
  auto image = AgentImage::Load("/bin/true");
  ASSERT_TRUE(image.ok()) << image.status();
  // The fd is O_RDWR underneath; reopen through /proc to write as an attacker with the fd would.
  int rw = ::open(("/proc/self/fd/" + std::to_string(image->fd())).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(rw, 0) << errno;
  EXPECT_EQ(::pwrite(rw, "x", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(rw, 1), -1);
  EXPECT_EQ(::ftruncate(rw, static_cast<off_t>(image->size()) + 4096), -1);
  void* map = ::mmap(nullptr, image->size(), PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
  EXPECT_EQ(map, MAP_FAILED);
  if (map != MAP_FAILED) ::munmap(map, image->size());
  EXPECT_EQ(::fcntl(rw, F_ADD_SEALS, 0), -1);
  ::close(rw);
}

TEST(AgentImageTest, RefusesWhatIsNotAnExecutable) {
  EXPECT_FALSE(AgentImage::Load("").ok());
  EXPECT_FALSE(AgentImage::Load("/nonexistent/sbx-agent").ok());
  EXPECT_FALSE(AgentImage::Load("/etc/hostname").ok());
  EXPECT_FALSE(AgentImage::Load("/tmp").ok());
}

}  // namespace
}  // namespace sbx::runtime::ns
