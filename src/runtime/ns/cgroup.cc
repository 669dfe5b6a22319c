#include "runtime/ns/cgroup.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/status_util.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::ns {

namespace cgroup_internal {

std::string Join(const std::string& a, const std::string& b) {
  if (b.empty() || b == "/") return a;
  if (a.empty()) return b;
  std::string out = a;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  size_t start = 0;
  while (start < b.size() && b[start] == '/') ++start;
  if (out != "/") out.push_back('/');
  out.append(b, start, std::string::npos);
  return out;
}

absl::Status WriteControl(const CgroupEnv& env, const std::string& dir, const std::string& file,
                          const std::string& value) {
  return WriteStringToFile(Join(dir, file), value, env.create_control_files);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace cgroup_internal

using cgroup_internal::Join;

namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

// /proc/mounts escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 2])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 3]))) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string Rebase(const CgroupEnv& env, const std::string& mount_point) {
  if (env.cgroupfs_root.empty()) return mount_point;
  static constexpr char kSysCgroup[] = "/sys/fs/cgroup";
  if (mount_point.rfind(kSysCgroup, 0) == 0) {
    return Join(env.cgroupfs_root, mount_point.substr(sizeof(kSysCgroup) - 1));
  }
  return Join(env.cgroupfs_root, mount_point);
}

struct MountEntry {
  std::string point;
  std::string type;
  std::set<std::string> options;
};

constexpr const char* kV1Controllers[] = {"memory", "pids", "cpu", "freezer"};

}  // namespace

absl::Status ValidateCgroupParent(const std::string& parent) {
  if (parent.empty()) return absl::OkStatus();
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        fmt::format("cgroup parent \"{}\": {} (want an absolute cgroup path such as /sbx)", parent, why));
  };
  if (parent[0] != '/') return bad("not absolute");
  if (parent == "/") return bad("the root cgroup cannot hold sandboxes directly");
  if (parent.back() == '/') return bad("ends with '/'");
  for (const std::string& part : Split(parent.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") return bad("has an empty, '.' or '..' component");
    if (part.find_first_of(" \t\n\\") != std::string::npos) return bad("has a blank or backslash");
  }
  return absl::OkStatus();
}

absl::StatusOr<CgroupLayout> DetectCgroupLayout(const CgroupEnv& env) {
  const std::string self_path = fmt::format("{}/self/cgroup", env.proc_root);
  const std::string mounts_path = fmt::format("{}/mounts", env.proc_root);
  SBX_ASSIGN_OR_RETURN(std::string self, ReadFileToString(self_path));
  SBX_ASSIGN_OR_RETURN(std::string mounts_text, ReadFileToString(mounts_path));

  std::vector<MountEntry> mounts;
  std::istringstream ms(mounts_text);
  for (std::string line; std::getline(ms, line);) {
    std::istringstream ls(line);
    std::string dev, point, type, opts;
    if (!(ls >> dev >> point >> type >> opts)) continue;
    if (type != "cgroup" && type != "cgroup2") continue;
    MountEntry e{Rebase(env, Unescape(point)), type, {}};
    for (auto& o : Split(opts, ',')) e.options.insert(o);
    mounts.push_back(std::move(e));
  }

  CgroupLayout layout;
  bool have_v2_line = false;
  std::istringstream ss(self);
  for (std::string line; std::getline(ss, line);) {
    // hierarchy-id:controller-list:path (the path may contain ':').
    size_t c1 = line.find(':');
    if (c1 == std::string::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string hid = line.substr(0, c1);
    std::string ctrl = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (hid == "0" && ctrl.empty()) {
      have_v2_line = true;
      layout.v2_own = path;
      continue;
    }
    if (ctrl.empty() || ctrl.rfind("name=", 0) == 0) continue;
    std::vector<std::string> controllers = Split(ctrl, ',');
    bool wanted = false;
    for (const char* c : kV1Controllers) {
      if (std::find(controllers.begin(), controllers.end(), c) != controllers.end()) wanted = true;
    }
    if (!wanted) continue;
    const MountEntry* m = nullptr;
    for (const auto& e : mounts) {
      if (e.type != "cgroup") continue;
      bool all = std::all_of(controllers.begin(), controllers.end(),
                             [&](const std::string& c) { return e.options.count(c) > 0; });
      if (all) {
        m = &e;
        break;
      }
    }
    if (m == nullptr) continue;  // the hierarchy exists in the kernel but is not mounted here
    for (const char* c : kV1Controllers) {
      if (std::find(controllers.begin(), controllers.end(), c) != controllers.end()) {
        layout.v1[c] = CgroupLayout::V1Hierarchy{m->point, path, controllers};
      }
    }
  }
  for (const auto& e : mounts) {
    if (e.type == "cgroup2" && have_v2_line) {
      layout.has_v2 = true;
      layout.v2_mount = e.point;
      break;
    }
  }
  if (layout.v1.empty() && !layout.has_v2) {
    return absl::FailedPreconditionError(fmt::format(
        "cgroup detection: neither a cgroup v1 memory/pids/cpu hierarchy nor cgroup2 is mounted "
        "(read {} and {}); mount cgroupfs at /sys/fs/cgroup",
        self_path, mounts_path));
  }
  return layout;
}

// ---------------------------------------------------------------------------------------------
// SandboxCgroup

SandboxCgroup::SandboxCgroup(std::string id, std::vector<Dir> dirs)
    : id_(std::move(id)), dirs_(std::move(dirs)) {}

SandboxCgroup::~SandboxCgroup() {
  if (!armed_) return;
  bool any = std::any_of(dirs_.begin(), dirs_.end(), [](const Dir& d) { return d.created; });
  if (!any) return;
  if (absl::Status s = Destroy(); !s.ok()) {
    spdlog::error("cgroup cleanup of {} failed: {}", id_, std::string(s.message()));
  }
}

nlohmann::json SandboxCgroup::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& d : dirs_) j[d.key] = d.path;
  return j;
}

std::string SandboxCgroup::v2_path() const {
  for (const auto& d : dirs_) {
    if (d.v2) return d.path;
  }
  return "";
}

bool SandboxCgroup::Split() const {
  return !dirs_.empty() && cgroup_internal::FileExists(Join(dirs_.front().path, kWorkLeaf));
}

std::string SandboxCgroup::AgentOomCounterPath() const {
  if (!Split()) return "";
  // The agent's own directory: a child `agent` where one exists (pure v2, and sandboxes made
  // before the agent moved into the sandbox's directory on v1), else the directory itself.
  auto agent = [&](const std::string& dir) {
    const std::string child = Join(dir, kAgentLeaf);
    return cgroup_internal::FileExists(child) ? child : dir;
  };
  for (const auto& d : dirs_) {
    if (d.key == "memory" && !d.v2) return Join(agent(d.path), "memory.oom_control");
  }
  const std::string v2 = v2_path();
  return v2.empty() ? "" : Join(agent(v2), "memory.events");
}

std::string SandboxCgroup::OomCounterPath() const {
  // Split: the workload's child, where its OOM kills happen (the agent's are not sessions').
  const bool split = Split();
  auto in = [&](const std::string& dir) { return split ? Join(dir, kWorkLeaf) : dir; };
  for (const auto& d : dirs_) {
    if (d.key == "memory" && !d.v2) return Join(in(d.path), "memory.oom_control");
  }
  std::string v2 = v2_path();
  return v2.empty() ? "" : Join(in(v2), "memory.events");
}

absl::StatusOr<std::vector<UniqueFd>> SandboxCgroup::OpenProcsFiles(bool skip_v2, const std::string& leaf) const {
  std::vector<UniqueFd> out;
  for (const auto& d : dirs_) {
    if (d.v2 && skip_v2) continue;
    std::string p = Join(leaf.empty() ? d.path : Join(d.path, leaf), "cgroup.procs");
    UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus(errno, fmt::format("join cgroup: open({})", p));
    out.push_back(std::move(fd));
  }
  return out;
}

absl::StatusOr<UniqueFd> SandboxCgroup::OpenV2Dir(const std::string& leaf) const {
  std::string p = v2_path();
  if (p.empty()) return absl::FailedPreconditionError("join cgroup: no cgroup v2 directory");
  if (!leaf.empty()) p = Join(p, leaf);
  UniqueFd fd(::open(p.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, fmt::format("join cgroup: open({})", p));
  return fd;
}

namespace {

// `dir` and its split children that exist: where a sandbox's processes can be.
std::vector<std::string> WithLeaves(const std::string& dir) {
  std::vector<std::string> out = {dir};
  for (const char* leaf : {kAgentLeaf, kWorkLeaf}) {
    std::string child = Join(dir, leaf);
    if (cgroup_internal::FileExists(child)) out.push_back(std::move(child));
  }
  return out;
}

absl::StatusOr<std::vector<pid_t>> ReadProcs(const std::string& dir) {
  auto text = ReadFileToString(Join(dir, "cgroup.procs"));
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::vector<pid_t>{};
    return text.status();
  }
  return ParsePidList(*text);
}

void SleepFor(std::chrono::microseconds d) {
  struct timespec ts{static_cast<time_t>(d.count() / 1000000),
                     static_cast<long>((d.count() % 1000000) * 1000)};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int RemainingMs(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count()) + 1;
}

}  // namespace

std::vector<pid_t> SandboxCgroup::Pids() const {
  std::set<pid_t> out;
  for (const auto& d : dirs_) {
    for (const std::string& dir : WithLeaves(d.path)) {
      auto pids = ReadProcs(dir);
      if (pids.ok()) out.insert(pids->begin(), pids->end());
    }
  }
  return {out.begin(), out.end()};
}

absl::Status SandboxCgroup::Kill() const {
  std::string v2 = v2_path();
  if (!v2.empty() && cgroup_internal::FileExists(Join(v2, "cgroup.kill"))) {
    absl::Status s = WriteStringToFile(Join(v2, "cgroup.kill"), "1");
    if (s.ok() || absl::IsNotFound(s)) {
      ThawAfterKill();
      return absl::OkStatus();
    }
    return Annotate(s, fmt::format("kill sandbox {}", id_));
  }
  // No cgroup.kill (v1 only, or a kernel older than 5.14): signal every listed pid.
  for (const auto& d : dirs_) {
    for (const std::string& dir : WithLeaves(d.path)) {
      SBX_ASSIGN_OR_RETURN(std::vector<pid_t> pids, ReadProcs(dir));
      for (pid_t p : pids) ::kill(p, SIGKILL);
    }
  }
  ThawAfterKill();
  return absl::OkStatus();
}

absl::Status SandboxCgroup::WaitEmpty(std::chrono::steady_clock::time_point deadline) const {
  std::string v2 = v2_path();
  if (!v2.empty()) {
    std::string events = Join(v2, "cgroup.events");
    UniqueFd fd(::open(events.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd) {
      // Every process of the sandbox is in the v2 directory's subtree too (the agent is cloned
      // into it, its children inherit it or join work/ in every hierarchy), and a task leaves
      // all hierarchies at once when it exits: "populated 0" there means the v1 directories
      // are empty as well, so they are not read (9 reads and 6 stats per delete on hybrid
      // hosts). Remove() still retries the EBUSY of a task that is not yet released.
      for (;;) {
        char buf[256];
        ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
        if (n < 0) return ErrnoStatus(errno, fmt::format("wait for cgroup: read({})", events));
        buf[n] = '\0';
        const char* p = std::strstr(buf, "populated ");
        if (p == nullptr) break;
        if (p[10] == '0') return absl::OkStatus();
        int ms = RemainingMs(deadline);
        if (ms == 0) {
          return absl::DeadlineExceededError(fmt::format(
              "wait for cgroup: {} still populated after {} ms", v2, kCgroupDrainTimeout.count()));
        }
        // kernfs signals a change of cgroup.events with POLLPRI.
        struct pollfd pfd{fd.get(), POLLPRI, 0};
        if (::poll(&pfd, 1, std::min(ms, 100)) < 0 && errno != EINTR) {
          return ErrnoStatus(errno, fmt::format("wait for cgroup: poll({})", events));
        }
      }
    } else if (errno != ENOENT) {
      return ErrnoStatus(errno, fmt::format("wait for cgroup: open({})", events));
    }
  }
  // v1 has no notification; an exiting task leaves cgroup.procs within microseconds, so a short
  // backoff loop is enough. Stragglers (a fork racing the first kill) are killed again.
  for (const auto& d : dirs_) {
    if (d.v2 && !v2.empty()) continue;
    for (const std::string& dir : WithLeaves(d.path)) {
      auto backoff = std::chrono::microseconds(100);
      for (;;) {
        SBX_ASSIGN_OR_RETURN(std::vector<pid_t> pids, ReadProcs(dir));
        if (pids.empty()) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          return absl::DeadlineExceededError(
              fmt::format("wait for cgroup: {} still has processes {} after {} ms", dir,
                          fmt::join(pids, ","), kCgroupDrainTimeout.count()));
        }
        for (pid_t p : pids) ::kill(p, SIGKILL);
        SleepFor(backoff);
        backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SandboxCgroup::Remove(std::chrono::steady_clock::time_point deadline) {
  absl::Status result = absl::OkStatus();
  // rmdir, retrying EBUSY (a task still on its way out, or a zombie not yet released).
  auto remove = [&](const std::string& path) -> bool {
    auto backoff = std::chrono::microseconds(100);
    for (;;) {
      if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return true;
      int err = errno;
      if (err != EBUSY || std::chrono::steady_clock::now() >= deadline) {
        if (result.ok()) result = ErrnoStatus(err, fmt::format("remove cgroup: rmdir({})", path));
        return false;
      }
      SleepFor(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
    }
  };
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    if (!it->created) continue;
    // The children first (a split cgroup); they belong to whoever created the directory. No
    // agent child where the agent sits in the directory itself (agent_leaf() "").
    bool children_gone = remove(Join(it->path, kWorkLeaf));
    if (!agent_leaf_.empty()) children_gone = remove(Join(it->path, agent_leaf_)) && children_gone;
    if (children_gone && remove(it->path)) it->created = false;
  }
  return result;
}

absl::Status SandboxCgroup::Destroy() {
  auto deadline = std::chrono::steady_clock::now() + kCgroupDrainTimeout;
  absl::Status s = Kill();
  if (s.ok()) s = WaitEmpty(deadline);
  absl::Status r = Remove(deadline);
  if (!s.ok()) return s;
  if (!r.ok()) return r;
  armed_ = false;
  return absl::OkStatus();
}

std::unique_ptr<SandboxCgroup> CgroupDriver::Existing(const std::string& id) const {
  std::vector<SandboxCgroup::Dir> dirs = SandboxDirs(id);
  for (auto& d : dirs) d.created = true;
  auto cg = std::make_unique<SandboxCgroup>(id, std::move(dirs));
  cg->Release();
  return cg;
}

absl::StatusOr<std::unique_ptr<CgroupDriver>> MakeCgroupDriver(const CgroupEnv& env) {
  SBX_RETURN_IF_ERROR(ValidateCgroupParent(env.parent));
  SBX_ASSIGN_OR_RETURN(CgroupLayout layout, DetectCgroupLayout(env));
  if (layout.pure_v2()) return MakeV2Driver(layout, env);
  return MakeV1HybridDriver(layout, env);
}

namespace {

std::optional<int64_t> ReadNumber(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  std::istringstream in(*text);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  if (word == "max") return int64_t{-1};
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(word.c_str(), &end, 10);
  if (errno != 0 || end == word.c_str() || *end != '\0') return std::nullopt;
  return static_cast<int64_t>(v);
}

void Tighten(int64_t& have, int64_t v) {
  if (v > 0 && (have == 0 || v < have)) have = v;
}

}  // namespace

CgroupCeiling ReadCgroupCeiling(const std::vector<std::string>& dirs) {
  // v1 writes "no limit" as LLONG_MAX rounded down to a page.
  constexpr int64_t kUnlimited = int64_t{1} << 62;
  CgroupCeiling out;
  for (std::string d : dirs) {
    // Up the tree until a directory has none of the files: above the hierarchy's root.
    for (; !d.empty() && d != "/"; d = d.substr(0, d.rfind('/'))) {
      bool any = false;
      for (const char* f : {"memory.max", "memory.limit_in_bytes"}) {
        if (auto v = ReadNumber(cgroup_internal::Join(d, f))) {
          any = true;
          if (*v > 0 && *v < kUnlimited) Tighten(out.memory_bytes, *v);
        }
      }
      if (auto text = ReadFileToString(cgroup_internal::Join(d, "cpu.max")); text.ok()) {
        any = true;
        std::istringstream in(*text);
        std::string quota;
        int64_t period = 0;
        if (in >> quota >> period && quota != "max" && period > 0) {
          Tighten(out.cpu_millis, std::strtoll(quota.c_str(), nullptr, 10) * 1000 / period);
        }
      }
      auto quota = ReadNumber(cgroup_internal::Join(d, "cpu.cfs_quota_us"));
      auto period = ReadNumber(cgroup_internal::Join(d, "cpu.cfs_period_us"));
      if (quota || period) any = true;
      if (quota && period && *quota > 0 && *period > 0) {
        Tighten(out.cpu_millis, *quota * 1000 / *period);
      }
      if (!any) break;
    }
  }
  return out;
}

}  // namespace sbx::runtime::ns
