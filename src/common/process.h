// Running helper programs (mke2fs, QEMU, the VM bridge) from sbxd: find them, run one to its
// end, or start one that outlives sbxd.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sbx {

// An executable named `name`: itself when it holds a '/', else the first of /usr/sbin, /sbin,
// /usr/bin, /bin, /usr/local/bin and $PATH's absolute entries that has it (sbxd may run with
// systemd's minimal PATH, and mke2fs lives in sbin). NotFound names what is missing.
absl::StatusOr<std::string> FindProgram(const std::string& name);

// Runs argv[0] (an absolute path) with stdin from /dev/null to its end and returns its exit
// status (128 + signal when killed); its stdout and stderr (the first 4 KiB) go to *output for
// error messages. It inherits no other descriptor.
absl::StatusOr<int> RunProgram(const std::vector<std::string>& argv, std::string* output);

struct DetachedOptions {
  std::string log;                 // stdout and stderr, appended (created 0600)
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  int pass_fd = -1;                // when >= 0: given to the program as its fd 3
};

// Starts argv[0] in a session of its own (so it outlives a kill -9 of sbxd and no signal to
// sbxd's group reaches it), stdin /dev/null, default signal dispositions, no other open fds.
absl::StatusOr<pid_t> SpawnDetached(const std::vector<std::string>& argv, const DetachedOptions& opts);

// Closes every descriptor from 3 up that this process inherited: those without FD_CLOEXEC
// (a descriptor that survived the exec cannot have it). A shell's `$(sbxd &)` or a supervisor's
// pipe otherwise stays open in sbxd for its whole life, and whoever waits for its end waits
// forever. Call first thing in main, before anything opens descriptors of its own. Returns how
// many it closed.
absl::StatusOr<int> CloseInheritedDescriptors();

}  // namespace sbx
