// File operations of sbx-agent (ops "stat", "list", "mkdir", "delete", "move", "read",
// "write"; see src/protocol/protocol.h). They run in a worker child forked by the event loop
// for each file connection (agent.cc: ForkFileWorker): transfers are long and disk I/O blocks,
// and a child doing blocking I/O on its own connection is the simplest thing that never stalls
// the loop. The loop already reaps every child; a worker's pid is not a session's.
//
// A worker gives up when the host is silent for kFileIoTimeout (socket timeouts), so a
// vanished sbxd never leaves workers behind.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "protocol/protocol.h"

namespace sbx::agent {

inline constexpr std::chrono::seconds kFileIoTimeout{120};
inline constexpr size_t kDataChunk = 256 * 1024;  // bytes per kData frame the agent sends

struct FileOptions {
  int root_fd = -1;            // O_PATH fd of the sandbox's root ("/" in the ns runtime)
  std::string root_path = "/";  // the same, as a path (for /etc/passwd of `user`)
  std::string workdir = "/";   // what relative paths are relative to
  // A microVM build step's overlay upper (--upper-fd; vm_init.cc keeps it open across the move
  // of the root): export_layer streams it. -1: export_layer is refused.
  int upper_fd = -1;
  // Processes export_layer must not end besides itself and the agent (the guest's mux pump,
  // which carries every connection to the host).
  std::vector<int> spare_pids;
};

// True for the ops ServeFileRequest handles.
bool IsFileOp(std::string_view op);

// Serves one file request on the blocking, connected socket `fd`: sends hello, the response,
// and whatever the op streams. `rest` holds bytes the loop read past the request. Returns
// when the request is done (or failed); the caller then exits.
void ServeFileRequest(int fd, const protocol::Json& req, protocol::FrameDecoder rest,
                      const FileOptions& opts);

}  // namespace sbx::agent
