// export_layer: a template build's RUN step on a microVM keeps what its command changed. The
// overlay's upper is on the guest's disk, which only the guest's kernel reads: mounting a disk
// a guest wrote raw blocks to would hand the host's ext4 code whatever the guest crafted. So
// the agent walks the upper (archive/upper_layer.h, the walk the ns runtime runs on the host)
// and streams the tar; sbxd hashes, bounds and unpacks it like any layer it did not make.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "agent/files_internal.h"
#include "agent/procfs.h"
#include "archive/upper_layer.h"

namespace sbx::agent::fileops {
namespace {

// Ends every descendant of the agent (this worker's parent; in the guest PID 1, which every
// orphan is re-parented to) but this worker and `spare`: what the step left running (a
// daemon, a background job) must not change a file while it is read, and the VM is destroyed
// next. Repeats while forks race with the scan.
absl::Status EndOtherProcesses(const std::vector<int>& spare) {
  const pid_t self = ::getpid();
  const pid_t agent = ::getppid();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t p : LiveDescendants(agent)) {
      if (p != self && std::find(spare.begin(), spare.end(), p) == spare.end()) left.push_back(p);
    }
    if (left.empty()) return absl::OkStatus();
    for (pid_t p : left) ::kill(p, SIGKILL);
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "export layer: {} processes still alive 5 s after SIGKILL (first: pid {})", left.size(),
          left.front()));
    }
    // The agent's loop reaps them; a SIGKILLed process dies within a scheduler tick or two.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

absl::Status OpExportLayer(Conn& c, const protocol::ExportLayerRequest& req, const FileOptions& o) {
  if (o.upper_fd < 0) {
    return c.Fail(kResponse, absl::FailedPreconditionError(
                                 "export layer: this agent serves no build step (no --upper-fd)"));
  }
  if (absl::Status s = EndOtherProcesses(o.spare_pids); !s.ok()) return c.Fail(kResponse, s);
  SBX_RETURN_IF_ERROR(c.SendJson(FrameType::kResponse, protocol::OkReply{}.ToJson()));
  archive::TarSink sink = [&](std::string_view piece) -> absl::Status {
    while (!piece.empty()) {
      const size_t n = std::min(piece.size(), kDataChunk);
      SBX_RETURN_IF_ERROR(c.Send(FrameType::kData, piece.substr(0, n)));
      piece.remove_prefix(n);
    }
    return absl::OkStatus();
  };
  // The guest's own uids: its kernel maps nothing, so owners go into the layer as they are.
  auto walk = archive::WriteUpperAsLayer(o.upper_fd, 0, 0, sink, {}, req.max_entries);
  if (!walk.ok()) return c.Fail(kEnd, walk.status());
  return c.SendJson(FrameType::kEnd, protocol::ExportLayerEnd{walk->entries, walk->tar_bytes}.ToJson());
}

}  // namespace sbx::agent::fileops
