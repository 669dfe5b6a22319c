// The sbx-agent binary as a sealed memfd, loaded once per backend.
//
// Every sandbox execs the agent with execveat(memfd, "", ..., AT_EMPTY_PATH). Its
// /proc/self/exe then points at this memfd, whose write/grow/shrink seals make it immutable, so
// a process inside the sandbox can never overwrite the host's agent binary through
// /proc/self/exe (runc's CVE-2019-5736), and replacing the file on disk never affects running
// sandboxes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace sbx::runtime::ns {

class AgentImage {
 public:
  static absl::StatusOr<AgentImage> Load(const std::string& path);
  int fd() const { return fd_.get(); }
  size_t size() const { return size_; }

 private:
  AgentImage(UniqueFd fd, size_t size) : fd_(std::move(fd)), size_(size) {}
  UniqueFd fd_;
  size_t size_ = 0;
};

}  // namespace sbx::runtime::ns
