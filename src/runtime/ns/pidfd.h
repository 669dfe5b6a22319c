// pidfd syscalls. glibc 2.36's <sys/pidfd.h> lacks extern "C" (fixed in 2.37), so C++ cannot
// link against its wrappers; these call the syscalls directly.
#pragma once

#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace sbx::runtime::ns {

inline int PidfdOpen(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

inline int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

}  // namespace sbx::runtime::ns
