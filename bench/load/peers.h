// The peers measured in the same run as sbx: other ways of spawning the same command on this
// host, each run by this process with posix_spawn + waitpid and its stdout read through a pipe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "load/stats.h"

namespace sbx::load {

// Absolute path of `name` on PATH (and /usr/sbin, /sbin, where runc lives), "" if absent.
std::string FindBinary(const std::string& name);

struct SpawnOutcome {
  std::string stdout_head;  // the first 4 KiB of stdout
  uint64_t stdout_bytes = 0;
  int wait_status = 0;
  double ms = 0;  // posix_spawn → stdout EOF → waitpid, on CLOCK_MONOTONIC
};
// Spawns `argv` (argv[0] an absolute path), reads its stdout to EOF into a `read_buf`-byte
// buffer, reaps it. stderr is captured and quoted in the error when the exit is not 0.
absl::StatusOr<SpawnOutcome> SpawnAndRead(const std::vector<std::string>& argv,
                                          size_t read_buf = 64 * 1024);

// `iterations` runs of a command whose stdout must be `expect_stdout`. `binary` is looked up
// with FindBinary and replaces argv[0]; missing → Result::missing.
Result RunSpawnPeer(const std::string& binary, std::vector<std::string> argv,
                    const std::string& expect_stdout, int iterations);

// bwrap --unshare-all … echo hi, as in feasibility row 9a.
std::vector<std::string> BwrapEchoArgv();
// unshare (util-linux) into new pid, mount, net, ipc, uts and cgroup namespaces, echo hi.
std::vector<std::string> UnshareEchoArgv();

// `runc run` of a bundle generated in a temporary directory (host /usr and /etc bound
// read-only, its own network namespace), a unique container id per run; everything removed.
Result RunRuncPeer(int iterations);

// `cat /dev/zero | head -c BYTES` read through a pipe into a 1 MiB buffer: the ceiling for attach
// throughput on this machine. Throughput in MB/s (10^6 bytes).
Result RunPipePeer(uint64_t bytes, int iterations);

}  // namespace sbx::load
