#include "load/peers.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/status_util.h"
#include "common/unique_fd.h"
#include "load/sysinfo.h"

extern char** environ;

namespace sbx::load {
namespace {

std::string DescribeWait(int status) {
  if (WIFEXITED(status)) return fmt::format("exit {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return fmt::format("wait status {}", status);
}

std::string Quote(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    out += a;
  }
  return out.size() > 160 ? out.substr(0, 160) + "…" : out;
}

}  // namespace

std::string FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs =
      fmt::format("{}:/usr/local/sbin:/usr/sbin:/sbin", path ? path : "/usr/bin:/bin");
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (!dir.empty()) {
      std::string candidate = dir + "/" + name;
      struct stat st;
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    start = end + 1;
  }
  return "";
}

absl::StatusOr<SpawnOutcome> SpawnAndRead(const std::vector<std::string>& argv,
                                          size_t read_buf) {
  const std::string what = fmt::format("spawn {}", Quote(argv));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, what + ": pipe2");
  UniqueFd rd(p[0]);
  UniqueFd wr(p[1]);
  UniqueFd err(::memfd_create("sbx-load-stderr", MFD_CLOEXEC));
  if (!err) return ErrnoStatus(errno, what + ": memfd_create");

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err.get(), STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  SpawnOutcome out;
  const auto t0 = Clock::now();
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return ErrnoStatus(rc, what + ": posix_spawn");
  wr.Reset();  // so that the child's exit is our EOF

  std::vector<char> buf(read_buf);
  absl::Status read_status = absl::OkStatus();
  for (;;) {
    ssize_t n = ::read(rd.get(), buf.data(), buf.size());
    if (n > 0) {
      if (out.stdout_head.size() < 4096) {
        size_t keep = std::min<size_t>(static_cast<size_t>(n), 4096 - out.stdout_head.size());
        out.stdout_head.append(buf.data(), keep);
      }
      out.stdout_bytes += static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    read_status = ErrnoStatus(errno, what + ": read(stdout pipe)");
    break;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus(errno, what + ": waitpid");
  }
  out.ms = MsBetween(t0, Clock::now());
  out.wait_status = status;
  SBX_RETURN_IF_ERROR(read_status);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char ebuf[512] = {};
    ssize_t n = ::pread(err.get(), ebuf, sizeof(ebuf) - 1, 0);
    std::string stderr_text = n > 0 ? std::string(ebuf, static_cast<size_t>(n)) : "";
    while (!stderr_text.empty() && stderr_text.back() == '\n') stderr_text.pop_back();
    return absl::InternalError(
        fmt::format("{}: {} (stderr: {})", what, DescribeWait(status), stderr_text));
  }
  return out;
}

Result RunSpawnPeer(const std::string& binary, std::vector<std::string> argv,
                    const std::string& expect_stdout, int iterations) {
  Result r;
  std::string path = FindBinary(binary);
  if (path.empty()) {
    r.missing = fmt::format("{} not found on PATH", binary);
    return r;
  }
  argv[0] = path;
  r.extra["command"] = Quote(argv);
  for (int i = 0; i < iterations; ++i) {
    auto out = SpawnAndRead(argv);
    if (!out.ok()) {
      r.AddError(std::string(out.status().message()));
      continue;
    }
    if (out->stdout_head != expect_stdout) {
      r.AddError(fmt::format("{}: stdout was \"{}\", expected \"{}\"", binary,
                             out->stdout_head.substr(0, 100), expect_stdout));
      continue;
    }
    r.samples_ms.push_back(out->ms);
  }
  if (!r.samples_ms.empty()) {
    auto s = Summarize(r.samples_ms);
    r.throughput = 1000.0 / s->mean;
    r.throughput_unit = "spawns/s";
  }
  return r;
}

std::vector<std::string> BwrapEchoArgv() {
  return {"bwrap",     "--unshare-all", "--die-with-parent", "--ro-bind",   "/usr",
          "/usr",      "--symlink",     "usr/bin",           "/bin",        "--symlink",
          "usr/lib",   "/lib",          "--symlink",         "usr/lib64",   "/lib64",
          "--symlink", "usr/sbin",      "/sbin",             "--proc",      "/proc",
          "--dev",     "/dev",          "--tmpfs",           "/tmp",        "echo",
          "hi"};
}

std::vector<std::string> UnshareEchoArgv() {
  return {"unshare", "--fork",   "--pid",         "--mount", "--net", "--ipc",
          "--uts",   "--cgroup", "--mount-proc",  "echo",    "hi"};
}

namespace {

// A runc bundle in a temporary directory, removed (with any container left in its private
// state root) when this object goes away.
class RuncBundle {
 public:
  static absl::StatusOr<std::unique_ptr<RuncBundle>> Make(const std::string& runc) {
    char tmpl[] = "/tmp/sbx-load-runc.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return ErrnoStatus(errno, "runc bundle: mkdtemp");
    auto b = std::unique_ptr<RuncBundle>(new RuncBundle(runc, tmpl));
    SBX_RETURN_IF_ERROR(b->Fill());
    return b;
  }
  ~RuncBundle() {
    // `runc run` deletes its container when the process exits; this catches one left by a
    // failed run.
    for (const std::string& id : ids_) {
      auto ignored = SpawnAndRead({runc_, "--root", state(), "delete", "--force", id});
      (void)ignored;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // does not follow the rootfs symlinks
  }
  std::string state() const { return dir_ + "/state"; }
  const std::string& dir() const { return dir_; }
  std::vector<std::string> RunArgv(const std::string& id) {
    ids_.push_back(id);
    return {runc_, "--root", state(), "run", "--bundle", dir_, id};
  }
  void Ran(const std::string& id) { std::erase(ids_, id); }

 private:
  RuncBundle(std::string runc, std::string dir) : runc_(std::move(runc)), dir_(std::move(dir)) {}

  absl::Status Fill() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const std::string rootfs = dir_ + "/rootfs";
    for (const char* d : {"usr", "etc", "proc", "dev", "sys", "tmp"}) {
      fs::create_directories(rootfs + "/" + d, ec);
      if (ec) {
        return absl::InternalError(fmt::format("runc bundle: mkdir {}: {}", d, ec.message()));
      }
    }
    for (const char* l : {"bin", "lib", "lib64", "sbin"}) {
      fs::create_symlink(fmt::format("usr/{}", l), rootfs + "/" + l, ec);
      if (ec) {
        return absl::InternalError(fmt::format("runc bundle: symlink {}: {}", l, ec.message()));
      }
    }
    fs::create_directories(state(), ec);
    SBX_RETURN_IF_ERROR(Annotate(SpawnAndRead({runc_, "spec", "--bundle", dir_}).status(),
                                 "runc bundle: runc spec"));
    const std::string path = dir_ + "/config.json";
    SBX_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    nlohmann::json spec = nlohmann::json::parse(text, nullptr, false);
    if (!spec.is_object() || !spec.contains("process") || !spec.contains("mounts")) {
      return absl::InternalError("runc bundle: runc spec wrote an unexpected config.json");
    }
    spec["process"]["args"] = {"echo", "hi"};
    spec["process"]["terminal"] = false;
    spec["root"] = {{"path", "rootfs"}, {"readonly", true}};
    for (const char* d : {"/usr", "/etc"}) {
      spec["mounts"].push_back({{"destination", d},
                                {"type", "bind"},
                                {"source", d},
                                {"options", {"rbind", "ro", "nosuid", "nodev"}}});
    }
    // The default spec already has pid, ipc, uts, mount and network namespaces; the network
    // namespace is required here because sbx sandboxes get one too.
    bool has_net = false;
    for (const auto& ns : spec["linux"]["namespaces"]) {
      if (ns.value("type", "") == "network") has_net = true;
    }
    if (!has_net) spec["linux"]["namespaces"].push_back({{"type", "network"}});
    std::ofstream out(path, std::ios::trunc);
    out << spec.dump(2);
    if (!out) return absl::InternalError(fmt::format("runc bundle: write {}", path));
    return absl::OkStatus();
  }

  std::string runc_;
  std::string dir_;
  std::vector<std::string> ids_;
};

}  // namespace

Result RunRuncPeer(int iterations) {
  Result r;
  std::string runc = FindBinary("runc");
  if (runc.empty()) {
    r.missing = "runc not found on PATH (apt-get install runc)";
    return r;
  }
  auto bundle = RuncBundle::Make(runc);
  if (!bundle.ok()) {
    r.failure = std::string(bundle.status().message());
    return r;
  }
  r.extra["command"] = fmt::format("runc --root STATE run --bundle BUNDLE ID (echo hi)");
  for (int i = 0; i < iterations; ++i) {
    std::string id = fmt::format("sbx-load-{}-{}", ::getpid(), i);
    auto out = SpawnAndRead((*bundle)->RunArgv(id));
    if (!out.ok()) {
      r.AddError(std::string(out.status().message()));
      continue;
    }
    (*bundle)->Ran(id);
    if (out->stdout_head != "hi\n") {
      r.AddError(fmt::format("runc: stdout was \"{}\", expected \"hi\\n\"",
                             out->stdout_head.substr(0, 100)));
      continue;
    }
    r.samples_ms.push_back(out->ms);
  }
  if (!r.samples_ms.empty()) {
    r.throughput = 1000.0 / Summarize(r.samples_ms)->mean;
    r.throughput_unit = "spawns/s";
  }
  return r;
}

Result RunPipePeer(uint64_t bytes, int iterations) {
  Result r;
  // The peer the benchmark issue names: `cat /dev/zero | head -c N`, two processes and two
  // pipes like the attach path's producer and reader.
  std::string sh = FindBinary("sh");
  if (sh.empty() || FindBinary("cat").empty() || FindBinary("head").empty()) {
    r.missing = "sh, cat or head not found";
    return r;
  }
  std::vector<std::string> argv = {sh, "-c", fmt::format("cat /dev/zero | head -c {}", bytes)};
  r.extra["command"] = Quote(argv) + " | read(1 MiB buffer)";
  r.extra["bytes"] = bytes;
  for (int i = 0; i < iterations; ++i) {
    auto out = SpawnAndRead(argv, 1 << 20);
    if (!out.ok()) {
      r.AddError(std::string(out.status().message()));
      continue;
    }
    if (out->stdout_bytes != bytes) {
      r.AddError(fmt::format("pipe: read {} bytes, expected {}", out->stdout_bytes, bytes));
      continue;
    }
    r.samples_ms.push_back(out->ms);
  }
  if (!r.samples_ms.empty()) {
    // Throughput from the median run, like the attach scenario reports its median.
    double p50 = Summarize(r.samples_ms)->p50;
    r.throughput = static_cast<double>(bytes) / 1e6 / (p50 / 1000.0);
    r.throughput_unit = "MB/s";
  }
  return r;
}

}  // namespace sbx::load
