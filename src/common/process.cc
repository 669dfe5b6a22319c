#include "common/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "common/status_util.h"
#include "common/unique_fd.h"

extern char** environ;

namespace sbx {

absl::StatusOr<std::string> FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    return ErrnoStatus(errno, fmt::format("access({})", name));
  }
  std::vector<std::string> dirs = {"/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/bin"};
  if (const char* p = std::getenv("PATH"); p != nullptr) {
    const std::string path = p;
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      if (end > start) dirs.push_back(path.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const auto& d : dirs) {
    const std::string c = d + "/" + name;
    if (d.starts_with("/") && ::access(c.c_str(), X_OK) == 0) return c;
  }
  return absl::NotFoundError(fmt::format("{} is not installed (not in /usr/sbin, /sbin, /usr/bin, /bin or PATH)", name));
}

absl::StatusOr<int> RunProgram(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return ErrnoStatus(errno, "run: pipe2");
  UniqueFd rd(pipefd[0]);
  UniqueFd wr(pipefd[1]);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  // Nothing else of sbxd's: a descriptor a library opened without O_CLOEXEC (a client's
  // connection, the listening socket) would otherwise stay open in the program until it ends.
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, argv[0].c_str(), &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return ErrnoStatus(err, fmt::format("run: posix_spawn({})", argv[0]));
  wr.Reset();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(rd.get(), buf, sizeof(buf));
    if (n > 0) {
      if (output->size() < 4096) output->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus(errno, fmt::format("run: waitpid({})", argv[0]));
  }
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return WEXITSTATUS(wstatus);
}

absl::StatusOr<pid_t> SpawnDetached(const std::vector<std::string>& args, const DetachedOptions& opts) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : opts.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, opts.log.empty() ? "/dev/null" : opts.log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // dup2 clears FD_CLOEXEC on the copy; the original (>= 3) goes with closefrom.
  if (opts.pass_fd >= 0) posix_spawn_file_actions_adddup2(&fa, opts.pass_fd, 3);
  posix_spawn_file_actions_addclosefrom_np(&fa, opts.pass_fd >= 0 ? 4 : 3);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return ErrnoStatus(rc, fmt::format("posix_spawn({})", args[0]));
  return pid;
}

absl::StatusOr<int> CloseInheritedDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return ErrnoStatus(errno, "close inherited descriptors: opendir(/proc/self/fd)");
  // Collected first: closing while readdir walks the directory may skip or repeat entries.
  std::vector<int> inherited;
  while (const dirent* d = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(d->d_name, &end, 10);
    if (end == d->d_name || *end != '\0' || fd < 3 || fd == ::dirfd(dir)) continue;
    const int flags = ::fcntl(static_cast<int>(fd), F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) inherited.push_back(static_cast<int>(fd));
  }
  ::closedir(dir);
  for (int fd : inherited) ::close(fd);
  return static_cast<int>(inherited.size());
}

}  // namespace sbx
