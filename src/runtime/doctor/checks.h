// Internals of the doctor shared by its check files (and their tests): the probe context, the
// child-process runner, and the pure classifiers the checks are built from.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/doctor/doctor.h"

namespace sbx::runtime::doctor {

struct Context {
  const DoctorOptions& opts;
  bool live = true;  // opts.live and host_root == "/"
  bool ns = true;    // runtime "ns"
  bool microvm = false;  // runtime "microvm": its rows are required
  std::vector<Check>* out = nullptr;

  // `path` (absolute, host view) under opts.host_root.
  std::string Host(const std::string& path) const;
  absl::StatusOr<std::string> Read(const std::string& path) const;  // Host(path)
  bool Exists(const std::string& path) const;                          // lstat(Host(path))
  // False when this row is not to be run at all (only_required and not required).
  bool Wants(bool required) const { return required || !opts.only_required; }

  void Add(Check c) const { out->push_back(std::move(c)); }
  // The row of a syscall probe on a fake host root.
  void AddNotProbed(std::string id, std::string title, bool required) const;
};

// One function per file, each appending its rows in a fixed order.
void CheckKernel(const Context& ctx);
void CheckNamespaces(const Context& ctx);
void CheckCgroups(const Context& ctx);
void CheckFilesystems(const Context& ctx);
void CheckSecurity(const Context& ctx);
void CheckNetwork(const Context& ctx);
void CheckDevices(const Context& ctx);
void CheckStorage(const Context& ctx);
void CheckInstall(const Context& ctx);
void CheckDensity(const Context& ctx);  // density.cc
void CheckMicrovm(const Context& ctx);  // microvm.cc

// --- child processes ---------------------------------------------------------------------------

struct ChildOutcome {
  bool timed_out = false;  // killed after the timeout
  bool exited = false;     // ended by exit (not by a signal)
  int exit_code = 0;
  int signal = 0;          // when killed by a signal
  std::string output;      // everything the child wrote to its pipe
};

// fork()s; the child runs body(fd of a pipe to the parent) and _exit(0)s. The parent collects
// what the child writes until it exits, at most `timeout`, then SIGKILLs it. The child is a copy
// of this process: body may allocate only if the process had one thread at fork.
absl::StatusOr<ChildOutcome> RunInChild(const std::function<void(int fd)>& body,
                                        std::chrono::milliseconds timeout);

// A one-line summary for a child that did not end normally ("killed by signal 9 after the 5000
// ms timeout"), or "" when it exited.
std::string DescribeAbnormal(const ChildOutcome& o, std::chrono::milliseconds timeout);

// "EPERM (Operation not permitted)".
std::string ErrnoText(int err);

// --- pure pieces (unit-tested) ------------------------------------------------------------------

struct KernelVersion {
  int major = 0, minor = 0, patch = 0;
  bool AtLeast(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
};
// "6.18.44-fc-v669" -> 6.18.44; nullopt when it does not start with N.N.
std::optional<KernelVersion> ParseKernelRelease(const std::string& release);

// A kernel feature the runtimes use, with the release that brought it.
struct KernelFeature {
  const char* name;
  int major, minor;
  const char* used_for;
  enum Need { kNs, kNsUserns, kOptional } need;
};
const std::vector<KernelFeature>& KernelFeatures();

// Free space classification of the state dir: fail below 256 MiB (or 1000 inodes), warn below
// 2 GiB (or 10000 inodes).
inline constexpr uint64_t kSpaceFailBytes = 256ull << 20;
inline constexpr uint64_t kSpaceWarnBytes = 2ull << 30;
inline constexpr uint64_t kInodesFail = 1000;
inline constexpr uint64_t kInodesWarn = 10000;
CheckResult ClassifySpace(uint64_t free_bytes, uint64_t free_inodes, bool inodes_known);

// statfs f_type -> "ext4", "xfs", ...; "0x..." when unknown.
std::string FsTypeName(int64_t f_type);
// Whether a file system of this type can be idmapped on this kernel (ext4, xfs, btrfs: 5.12+;
// tmpfs: 6.3+).
bool FsTypeIdmappable(const std::string& name, const std::optional<KernelVersion>& kernel);

// Namespace limits below this are warned about: every sandbox holds one namespace of each
// type, and the pools (--userns-pool, --netns-pool) hold a few more.
inline constexpr long kLowNamespaceLimit = 1024;

// The longest agent socket path sbx makes under `state_dir`, and the most a sockaddr_un takes.
size_t AgentSocketPathLength(const std::string& state_dir);
size_t MaxSocketPathLength();

// Wraps `text` at `width` columns (words kept whole unless longer than a line).
std::vector<std::string> WrapText(const std::string& text, size_t width);

}  // namespace sbx::runtime::doctor
