// The doctor on fake host roots (no root needed): every failure path a real host can show,
// built as files in a temp dir. Syscall probes are off there (they report kSkip).
#include "runtime/doctor/doctor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <csignal>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/doctor/checks.h"
#include "runtime/ns/fsutil.h"

namespace sbx::runtime::doctor {
namespace {

class FakeHost {
 public:
  FakeHost() {
    char tmpl[] = "/tmp/sbx-doctor-test-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    EXPECT_NE(made, nullptr);
    root_ = made != nullptr ? made : "/nonexistent";
    // A healthy pure cgroup v2 host running Linux 6.1.
    Write("proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
    for (const char* ns : {"mnt", "pid", "net", "ipc", "uts", "cgroup", "time", "user"}) {
      Write(std::string("proc/self/ns/") + ns, "");
      Write(std::string("proc/sys/user/max_") + ns + "_namespaces", "63000\n");
    }
    Write("proc/self/cgroup", "0::/sbxd.service\n");
    Write("proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n");
    Write("sys/fs/cgroup/sbxd.service/cgroup.controllers", "cpuset cpu io memory pids\n");
    Write("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n");
    Write("proc/self/status", "Name:\tsbxd\nUid:\t0\t0\t0\t0\nCapEff:\t000001ffffffffff\n");
    Write("proc/sys/kernel/seccomp/actions_avail",
          "kill_process kill_thread trap errno user_notif trace log allow\n");
    Write("dev/loop-control", "");
    Write("usr/lib/sbx/sbx-agent", std::string("\x7f" "ELF\x02\x01\x01", 7) + std::string(64, '\0'));
    ::chmod(Path("usr/lib/sbx/sbx-agent").c_str(), 0755);
    ns::MkdirAll(Path("var/lib/sbx"), 0700).IgnoreError();
  }
  ~FakeHost() { ns::RemoveTree(root_).IgnoreError(); }

  std::string Path(const std::string& rel) const { return root_ + "/" + rel; }
  void Write(const std::string& rel, const std::string& content) {
    const std::string p = Path(rel);
    ASSERT_TRUE(ns::MkdirAll(p.substr(0, p.rfind('/')), 0755).ok()) << p;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
  }
  void Remove(const std::string& rel) { ns::RemoveTree(Path(rel)).IgnoreError(); }
  void Mkdir(const std::string& rel) { ASSERT_TRUE(ns::MkdirAll(Path(rel), 0755).ok()); }

  DoctorOptions Options(const std::string& runtime = "ns") const {
    DoctorOptions o;
    o.host_root = root_;
    o.state_dir = "/var/lib/sbx";
    o.runtime = runtime;
    o.agent_path = "/usr/lib/sbx/sbx-agent";
    o.template_check = [] { return absl::OkStatus(); };
    return o;
  }

 private:
  std::string root_;
};

const Check& Row(const Report& r, const std::string& id) {
  const Check* c = r.Find(id);
  static const Check kMissing{"(missing)", "", CheckResult::kSkip, "", "", false};
  EXPECT_NE(c, nullptr) << "no row " << id;
  return c != nullptr ? *c : kMissing;
}

// Every row names itself and says what it found; a problem says what to do.
void ExpectWellFormed(const Report& r) {
  std::set<std::string> ids;
  for (const auto& c : r.checks) {
    EXPECT_FALSE(c.id.empty());
    EXPECT_TRUE(ids.insert(c.id).second) << "duplicate row " << c.id;
    EXPECT_FALSE(c.title.empty()) << c.id;
    EXPECT_FALSE(c.detail.empty()) << c.id;
    if (c.result == CheckResult::kFail || c.result == CheckResult::kWarn) {
      EXPECT_FALSE(c.remedy.empty()) << c.id << ": " << c.detail;
    }
    if (!c.required) {
      EXPECT_NE(c.result, CheckResult::kFail) << c.id << " fails but is not required";
    }
  }
}

TEST(DoctorFakeHost, HealthyHostPasses) {
  FakeHost h;
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_TRUE(r.ok()) << FormatTable(r, false);
  for (const char* id : {"kernel.version", "namespace.user", "namespace.time", "namespace.limits",
                         "cgroup.layout", "cgroup.memory", "cgroup.pids", "cgroup.cpu", "cgroup.freezer",
                         "fs.overlay", "fs.ext4", "security.privileges", "seccomp.kernel",
                         "seccomp.policy", "device.loop", "storage.state_dir", "storage.socket_path",
                         "agent.binary", "template.base"}) {
    EXPECT_EQ(Row(r, id).result, CheckResult::kOk) << id << ": " << Row(r, id).detail;
  }
  // Syscall probes are not run on a fake root.
  for (const char* id : {"kernel.syscalls", "fs.idmap", "security.capabilities", "network.veth",
                         "network.nftables", "storage.space", "storage.disk_caps", "landlock"}) {
    EXPECT_EQ(Row(r, id).result, CheckResult::kSkip) << id;
  }
  EXPECT_NE(Row(r, "cgroup.layout").detail.find("cgroup v2"), std::string::npos);
  EXPECT_NE(Row(r, "seccomp.policy").detail.find("BPF instructions"), std::string::npos);
}

TEST(DoctorFakeHost, NoCgroupControllersFailsNamingEach) {
  FakeHost h;
  h.Write("sys/fs/cgroup/sbxd.service/cgroup.controllers", "cpuset io\n");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_FALSE(r.ok());
  for (const char* c : {"memory", "pids", "cpu"}) {
    const Check& row = Row(r, std::string("cgroup.") + c);
    EXPECT_EQ(row.result, CheckResult::kFail) << c;
    EXPECT_TRUE(row.required);
    EXPECT_NE(row.detail.find(std::string("'") + c + "'"), std::string::npos) << row.detail;
    EXPECT_NE(row.remedy.find("Delegate=yes"), std::string::npos) << row.remedy;
  }
  auto failed = r.RequiredFailures();
  EXPECT_EQ(failed.size(), 3u);
}

TEST(DoctorFakeHost, HybridWithoutV1MemoryNamesTheController) {
  FakeHost h;
  h.Write("proc/self/cgroup", "3:pids:/\n2:cpu,cpuacct:/\n0::/\n");
  h.Write("proc/mounts",
          "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
          "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
          "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n");
  h.Mkdir("sys/fs/cgroup/pids");
  h.Mkdir("sys/fs/cgroup/cpu,cpuacct");
  h.Mkdir("sys/fs/cgroup/unified");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(Row(r, "cgroup.layout").detail.find("hybrid"), std::string::npos) << Row(r, "cgroup.layout").detail;
  EXPECT_EQ(Row(r, "cgroup.memory").result, CheckResult::kFail);
  EXPECT_NE(Row(r, "cgroup.memory").detail.find("memory controller is not mounted"), std::string::npos)
      << Row(r, "cgroup.memory").detail;
  EXPECT_EQ(Row(r, "cgroup.pids").result, CheckResult::kOk) << Row(r, "cgroup.pids").detail;
  EXPECT_EQ(Row(r, "cgroup.cpu").result, CheckResult::kOk) << Row(r, "cgroup.cpu").detail;
  EXPECT_EQ(Row(r, "cgroup.freezer").result, CheckResult::kOk);  // v2 cgroup.freeze
}

TEST(DoctorFakeHost, NoCgroupsAtAll) {
  FakeHost h;
  h.Write("proc/mounts", "proc /proc proc rw 0 0\n");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(Row(r, "cgroup.layout").result, CheckResult::kFail);
  EXPECT_EQ(Row(r, "cgroup.memory").result, CheckResult::kFail);
}

TEST(DoctorFakeHost, NoOverlay) {
  FakeHost h;
  h.Write("proc/filesystems", "nodev\tsysfs\n\text4\n");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_FALSE(r.ok());
  const Check& row = Row(r, "fs.overlay");
  EXPECT_EQ(row.result, CheckResult::kFail);
  EXPECT_TRUE(row.required);
  EXPECT_NE(row.remedy.find("modprobe overlay"), std::string::npos);
}

TEST(DoctorFakeHost, NoKvmIsOnlyAWarning) {
  FakeHost h;
  Report r = RunDoctor(h.Options());
  const Check& row = Row(r, "device.kvm");
  EXPECT_EQ(row.result, CheckResult::kWarn);
  EXPECT_FALSE(row.required);
  EXPECT_NE(row.detail.find("no "), std::string::npos) << row.detail;
  EXPECT_TRUE(r.ok());
}

TEST(DoctorFakeHost, PvmHostSaysStockGuestsCannotBoot) {
  FakeHost h;
  h.Write("dev/kvm", "");
  h.Mkdir("sys/module/kvm");
  h.Mkdir("sys/module/kvm_pvm");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  const Check& row = Row(r, "device.kvm");
  EXPECT_EQ(row.result, CheckResult::kWarn);
  EXPECT_FALSE(row.required);
  EXPECT_NE(row.detail.find("PVM-only KVM: stock guest kernels cannot boot"), std::string::npos) << row.detail;
  EXPECT_NE(row.detail.find("the microvm runtime runs guests under TCG"), std::string::npos) << row.detail;
  EXPECT_TRUE(r.ok());
}

TEST(DoctorFakeHost, HardwareKvmSaysMicrovmUsesIt) {
  FakeHost h;
  h.Write("dev/kvm", "");
  h.Mkdir("sys/module/kvm_intel");
  h.Mkdir("sys/module/kvm_pvm");  // loaded too, but hardware KVM wins
  Report r = RunDoctor(h.Options());
  const Check& row = Row(r, "device.kvm");
  EXPECT_EQ(row.result, CheckResult::kOk) << row.detail;
  EXPECT_NE(row.detail.find("the microvm runtime runs stock guests with KVM"), std::string::npos)
      << row.detail;
  EXPECT_EQ(row.detail.find("PVM"), std::string::npos);
}

TEST(DoctorFakeHost, MicrovmRowsNameQemuAndTheGuestKernelOrTheirPackages) {
  FakeHost h;
  Report r = RunDoctor(h.Options());
  const Check& qemu = Row(r, "microvm.qemu");
  EXPECT_EQ(qemu.result, CheckResult::kWarn);
  EXPECT_FALSE(qemu.required);
  EXPECT_NE(qemu.remedy.find("qemu-system-x86"), std::string::npos) << qemu.remedy;
  const Check& kernel = Row(r, "microvm.kernel");
  EXPECT_EQ(kernel.result, CheckResult::kWarn);
  EXPECT_NE(kernel.remedy.find("linux-image-amd64"), std::string::npos) << kernel.remedy;
  EXPECT_TRUE(r.ok());

  h.Write("usr/bin/qemu-system-x86_64", "");
  h.Write("boot/vmlinuz-6.1.0-28-amd64", "");
  r = RunDoctor(h.Options());
  EXPECT_EQ(Row(r, "microvm.qemu").result, CheckResult::kOk) << Row(r, "microvm.qemu").detail;
  const Check& found = Row(r, "microvm.kernel");
  EXPECT_EQ(found.result, CheckResult::kOk) << found.detail;
  EXPECT_NE(found.detail.find("vmlinuz-6.1.0-28-amd64"), std::string::npos) << found.detail;
}

TEST(DoctorFakeHost, OnRuntimeMicrovmItsRowsAreRequiredAndTheNsRowsAreNot) {
  FakeHost h;
  DoctorOptions o = h.Options();
  o.runtime = "microvm";
  Report r = RunDoctor(o);
  const Check& qemu = Row(r, "microvm.qemu");
  EXPECT_EQ(qemu.result, CheckResult::kFail);
  EXPECT_TRUE(qemu.required);
  EXPECT_NE(qemu.detail.find("cannot start on runtime microvm"), std::string::npos) << qemu.detail;
  EXPECT_EQ(Row(r, "microvm.kernel").result, CheckResult::kFail);
  EXPECT_FALSE(r.ok());
  std::vector<std::string> failed;
  for (const auto& c : r.RequiredFailures()) failed.push_back(c.id);
  EXPECT_EQ(failed, (std::vector<std::string>{"microvm.qemu", "microvm.kernel"}));

  h.Write("usr/bin/qemu-system-x86_64", "");
  h.Write("boot/vmlinuz-6.1.0-28-amd64", "");
  r = RunDoctor(o);
  EXPECT_TRUE(r.ok()) << FormatTable(r, false, 100, true);
}

// runtime.microvm.vmm = "firecracker": its binaries replace the QEMU row, and KVM that runs
// stock guests is required (no TCG to fall back to), where QEMU only warns.
TEST(DoctorFakeHost, OnFirecrackerItsBinariesAndStockGuestKvmAreRequired) {
  FakeHost h;
  h.Write("dev/kvm", "");
  h.Mkdir("sys/module/kvm");
  h.Mkdir("sys/module/kvm_pvm");
  h.Write("boot/vmlinuz-6.1.0-28-amd64", "");
  DoctorOptions o = h.Options();
  o.runtime = "microvm";
  o.microvm_vmm = "firecracker";
  Report r = RunDoctor(o);
  EXPECT_FALSE(std::any_of(r.checks.begin(), r.checks.end(),
                           [](const Check& c) { return c.id == "microvm.qemu"; }));
  const Check& fc = Row(r, "microvm.firecracker");
  EXPECT_EQ(fc.result, CheckResult::kFail);
  EXPECT_TRUE(fc.required);
  EXPECT_NE(fc.detail.find("no firecracker"), std::string::npos) << fc.detail;
  EXPECT_NE(fc.detail.find("no jailer"), std::string::npos) << fc.detail;
  const Check& kvm = Row(r, "device.kvm");
  EXPECT_EQ(kvm.result, CheckResult::kFail) << kvm.detail;
  EXPECT_TRUE(kvm.required);
  EXPECT_NE(kvm.detail.find("Firecracker has no software emulation"), std::string::npos) << kvm.detail;
  std::vector<std::string> failed;
  for (const auto& c : r.RequiredFailures()) failed.push_back(c.id);
  std::sort(failed.begin(), failed.end());
  EXPECT_EQ(failed, (std::vector<std::string>{"device.kvm", "microvm.firecracker"}));

  h.Write("usr/local/bin/firecracker", "");
  h.Write("usr/local/bin/jailer", "");
  h.Mkdir("sys/module/kvm_intel");
  r = RunDoctor(o);
  EXPECT_TRUE(r.ok()) << FormatTable(r, false, 100, true);
  EXPECT_EQ(Row(r, "microvm.firecracker").result, CheckResult::kOk);

  // Beside ns (microvm not the default) nothing of it is required.
  o.runtime = "ns";
  h.Remove("sys/module/kvm_intel");
  r = RunDoctor(o);
  EXPECT_FALSE(Row(r, "device.kvm").required);
  EXPECT_EQ(Row(r, "device.kvm").result, CheckResult::kWarn);
}

TEST(DoctorFakeHost, AnUnknownRuntimeNamesTheThreeItKnows) {
  FakeHost h;
  DoctorOptions o = h.Options();
  o.runtime = "gvisor";
  Report r = RunDoctor(o);
  ASSERT_EQ(r.checks.size(), 1u);
  EXPECT_NE(r.checks[0].remedy.find("--runtime microvm"), std::string::npos) << r.checks[0].remedy;
}

TEST(DoctorFakeHost, OldKernelNamesTheMissingFeatures) {
  FakeHost h;
  h.Write("proc/sys/kernel/osrelease", "5.4.0-150-generic\n");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_FALSE(r.ok());
  const Check& row = Row(r, "kernel.version");
  EXPECT_EQ(row.result, CheckResult::kFail);
  EXPECT_NE(row.detail.find("older than 5.12"), std::string::npos) << row.detail;
  EXPECT_NE(row.detail.find("close_range"), std::string::npos) << row.detail;
  EXPECT_NE(row.detail.find("MOUNT_ATTR_IDMAP"), std::string::npos) << row.detail;
  EXPECT_EQ(row.detail.find("clone3"), std::string::npos) << "5.4 has clone3: " << row.detail;
  EXPECT_NE(row.remedy.find("5.12"), std::string::npos);
}

TEST(DoctorFakeHost, KernelWithoutIdmapIsEnoughWithoutUserNamespaces) {
  FakeHost h;
  h.Write("proc/sys/kernel/osrelease", "5.11.0\n");
  DoctorOptions o = h.Options();
  EXPECT_EQ(Row(RunDoctor(o), "kernel.version").result, CheckResult::kFail);
  o.user_namespaces = false;
  Report r = RunDoctor(o);
  EXPECT_NE(Row(r, "kernel.version").result, CheckResult::kFail) << Row(r, "kernel.version").detail;
  EXPECT_FALSE(Row(r, "namespace.user").required);
  EXPECT_TRUE(r.ok()) << FormatTable(r, false);
}

TEST(DoctorFakeHost, KernelBeforeTimeNamespaces) {
  FakeHost h;
  h.Write("proc/sys/kernel/osrelease", "5.4.0\n");
  h.Remove("proc/self/ns/time");
  Report r = RunDoctor(h.Options());
  const Check& row = Row(r, "namespace.time");
  EXPECT_EQ(row.result, CheckResult::kFail);
  EXPECT_NE(row.remedy.find("CONFIG_TIME_NS"), std::string::npos) << row.remedy;
}

TEST(DoctorFakeHost, UserNamespacesDisabledBySysctl) {
  FakeHost h;
  h.Write("proc/sys/user/max_user_namespaces", "0\n");
  h.Write("proc/sys/kernel/unprivileged_userns_clone", "0\n");
  Report r = RunDoctor(h.Options());
  const Check& row = Row(r, "namespace.limits");
  EXPECT_EQ(row.result, CheckResult::kFail) << row.detail;
  EXPECT_NE(row.detail.find("user.max_user_namespaces is 0"), std::string::npos) << row.detail;
  EXPECT_NE(row.detail.find("unprivileged_userns_clone=0"), std::string::npos) << row.detail;
  EXPECT_NE(row.remedy.find("sysctl"), std::string::npos);
  // Without user namespaces the limit does not matter.
  DoctorOptions o = h.Options();
  o.user_namespaces = false;
  EXPECT_EQ(Row(RunDoctor(o), "namespace.limits").result, CheckResult::kOk);
}

TEST(DoctorFakeHost, LowNamespaceLimitWarns) {
  FakeHost h;
  h.Write("proc/sys/user/max_net_namespaces", "16\n");
  Report r = RunDoctor(h.Options());
  EXPECT_EQ(Row(r, "namespace.limits").result, CheckResult::kWarn);
  EXPECT_TRUE(r.ok());
}

TEST(DoctorFakeHost, NotRoot) {
  FakeHost h;
  h.Write("proc/self/status", "Name:\tsbx\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n");
  Report r = RunDoctor(h.Options());
  EXPECT_EQ(Row(r, "security.privileges").result, CheckResult::kFail);
  EXPECT_NE(Row(r, "security.privileges").detail.find("uid 1000"), std::string::npos);
  // The fake runtime needs no privileges.
  Report f = RunDoctor(h.Options("fake"));
  EXPECT_TRUE(f.ok()) << FormatTable(f, false);
}

TEST(DoctorFakeHost, NoSeccompNoLoop) {
  FakeHost h;
  h.Remove("proc/sys/kernel/seccomp");
  h.Remove("dev/loop-control");
  Report r = RunDoctor(h.Options());
  ExpectWellFormed(r);
  EXPECT_EQ(Row(r, "seccomp.kernel").result, CheckResult::kFail);
  EXPECT_EQ(Row(r, "device.loop").result, CheckResult::kFail);
  EXPECT_NE(Row(r, "device.loop").remedy.find("modprobe loop"), std::string::npos);
}

TEST(DoctorFakeHost, FakeRuntimeNeedsOnlyStateAgentTemplate) {
  FakeHost h;
  h.Write("sys/fs/cgroup/sbxd.service/cgroup.controllers", "");
  h.Write("proc/filesystems", "nodev\tsysfs\n");
  h.Write("proc/sys/kernel/osrelease", "4.19.0\n");
  h.Remove("dev/loop-control");
  Report r = RunDoctor(h.Options("fake"));
  ExpectWellFormed(r);
  EXPECT_TRUE(r.ok()) << FormatTable(r, false);
  for (const auto& c : r.checks) {
    const bool must = c.id == "storage.state_dir" || c.id == "storage.socket_path" ||
                      c.id == "storage.space" || c.id == "agent.binary" || c.id == "template.base";
    EXPECT_EQ(c.required, must) << c.id;
  }
  EXPECT_EQ(Row(r, "cgroup.memory").result, CheckResult::kWarn);
}

TEST(DoctorFakeHost, AgentProblems) {
  FakeHost h;
  DoctorOptions o = h.Options();
  o.agent_path = "/nonexistent/sbx-agent";
  Report r = RunDoctor(o);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(Row(r, "agent.binary").detail.find("ENOENT"), std::string::npos) << Row(r, "agent.binary").detail;

  h.Write("usr/lib/sbx/script", "#!/bin/sh\n");
  o.agent_path = "/usr/lib/sbx/script";
  EXPECT_NE(Row(RunDoctor(o), "agent.binary").detail.find("not an ELF"), std::string::npos);

  // The ns runtime execs a sealed copy: the mode bits do not matter there, they do for fake.
  ::chmod(h.Path("usr/lib/sbx/sbx-agent").c_str(), 0644);
  o = h.Options();
  EXPECT_EQ(Row(RunDoctor(o), "agent.binary").result, CheckResult::kOk);
  // (Even root passes access(X_OK) only when some x bit is set.)
  EXPECT_EQ(Row(RunDoctor(h.Options("fake")), "agent.binary").result, CheckResult::kFail);
}

TEST(DoctorFakeHost, TemplateFailureIsRequired) {
  FakeHost h;
  DoctorOptions o = h.Options("fake");
  o.template_check = [] { return absl::FailedPreconditionError("template 'base': no /usr"); };
  Report r = RunDoctor(o);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(Row(r, "template.base").result, CheckResult::kFail);
  EXPECT_EQ(Row(r, "template.base").detail, "template 'base': no /usr");
  o.template_check = nullptr;
  EXPECT_EQ(Row(RunDoctor(o), "template.base").result, CheckResult::kSkip);
}

TEST(DoctorFakeHost, StateDirProblems) {
  FakeHost h;
  DoctorOptions o = h.Options();
  o.state_dir = "/" + std::string(80, 'x');
  Report r = RunDoctor(o);
  EXPECT_EQ(Row(r, "storage.state_dir").result, CheckResult::kOk) << "creatable under /";
  const Check& sock = Row(r, "storage.socket_path");
  EXPECT_EQ(sock.result, CheckResult::kFail);
  EXPECT_NE(sock.remedy.find("at most 61 characters"), std::string::npos) << sock.remedy;

  o.state_dir = "relative/dir";
  EXPECT_EQ(Row(RunDoctor(o), "storage.state_dir").result, CheckResult::kFail);

  h.Write("var/lib/file", "x");
  o.state_dir = "/var/lib/file";
  EXPECT_NE(Row(RunDoctor(o), "storage.state_dir").detail.find("not a directory"), std::string::npos);
}

TEST(DoctorFakeHost, OnlyRequiredSkipsOptionalRows) {
  FakeHost h;
  DoctorOptions o = h.Options();
  o.only_required = true;
  Report r = RunDoctor(o);
  for (const auto& c : r.checks) EXPECT_TRUE(c.required) << c.id;
  EXPECT_EQ(r.Find("device.kvm"), nullptr);
  EXPECT_EQ(r.Find("network.veth"), nullptr);
  EXPECT_NE(r.Find("cgroup.memory"), nullptr);
}

TEST(DoctorFakeHost, UnknownRuntime) {
  FakeHost h;
  Report r = RunDoctor(h.Options("firecracker"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(Row(r, "doctor.runtime").result, CheckResult::kFail);
}

TEST(DoctorOutput, JsonShape) {
  FakeHost h;
  h.Write("proc/filesystems", "\text4\n");
  Report r = RunDoctor(h.Options());
  nlohmann::json j = ToJson(r);
  EXPECT_EQ(j["ok"], false);
  ASSERT_TRUE(j["checks"].is_array());
  ASSERT_EQ(j["checks"].size(), r.checks.size());
  for (const auto& c : j["checks"]) {
    for (const char* k : {"id", "title", "result", "detail", "remedy"}) EXPECT_TRUE(c[k].is_string()) << k;
    EXPECT_TRUE(c["required"].is_boolean());
    const std::string res = c["result"];
    EXPECT_TRUE(res == "ok" || res == "warn" || res == "fail" || res == "skip") << res;
  }
  nlohmann::json back;
  EXPECT_NO_THROW(back = nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back, j);
}

TEST(DoctorOutput, TableIsAlignedAndColoredOnlyWhenAsked) {
  FakeHost h;
  h.Write("proc/filesystems", "\text4\n");
  Report r = RunDoctor(h.Options());
  const std::string plain = FormatTable(r, false, 100);
  EXPECT_EQ(plain.find("\x1b["), std::string::npos);
  for (const auto& c : r.checks) EXPECT_NE(plain.find(c.id), std::string::npos) << c.id;
  EXPECT_NE(plain.find("fix: modprobe overlay"), std::string::npos) << plain;
  EXPECT_NE(plain.find("NOT READY"), std::string::npos);
  // Every line fits the width, and the result column starts at the same offset on every row.
  size_t result_col = std::string::npos;
  std::istringstream is(plain);
  for (std::string line; std::getline(is, line);) {
    EXPECT_LE(line.size(), 100u) << line;
    for (const auto& c : r.checks) {
      if (line.rfind(c.id + " ", 0) == 0) {
        size_t col = line.find_first_not_of(' ', c.id.size());
        if (result_col == std::string::npos) result_col = col;
        EXPECT_EQ(col, result_col) << line;
      }
    }
  }
  const std::string colored = FormatTable(r, true);
  EXPECT_NE(colored.find("\x1b[1;31mFAIL"), std::string::npos);
}

TEST(DoctorOutput, NewlinesInMessagesStayInTheirCell) {
  Report r;
  r.checks.push_back(Check{"fs.idmap", "idmapped mounts", CheckResult::kFail,
                           "write(/proc/1/uid_map, \"0 524288 65536\n\"): EPERM", "run as root", true});
  const std::string table = FormatTable(r, false);
  EXPECT_NE(table.find("65536\\n\"): EPERM"), std::string::npos) << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4) << table;  // header, row, fix, verdict
}

TEST(DoctorPure, KernelRelease) {
  auto v = ParseKernelRelease("6.18.44-fc-v669");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->major, 6);
  EXPECT_EQ(v->minor, 18);
  EXPECT_EQ(v->patch, 44);
  EXPECT_TRUE(v->AtLeast(5, 12));
  EXPECT_FALSE(v->AtLeast(6, 19));
  EXPECT_TRUE(ParseKernelRelease("5.4").has_value());
  EXPECT_FALSE(ParseKernelRelease("garbage").has_value());
  EXPECT_FALSE(ParseKernelRelease("").has_value());
}

TEST(DoctorPure, SpaceAndFsTypes) {
  EXPECT_EQ(ClassifySpace(100ull << 20, 1 << 20, true), CheckResult::kFail);
  EXPECT_EQ(ClassifySpace(1ull << 30, 1 << 20, true), CheckResult::kWarn);
  EXPECT_EQ(ClassifySpace(10ull << 30, 1 << 20, true), CheckResult::kOk);
  EXPECT_EQ(ClassifySpace(10ull << 30, 500, true), CheckResult::kFail);
  EXPECT_EQ(ClassifySpace(10ull << 30, 0, false), CheckResult::kOk);
  EXPECT_EQ(FsTypeName(0xEF53), "ext4");
  EXPECT_EQ(FsTypeName(0x01021994), "tmpfs");
  EXPECT_EQ(FsTypeName(0x1234), "0x1234");
  EXPECT_TRUE(FsTypeIdmappable("ext4", KernelVersion{6, 1, 0}));
  EXPECT_FALSE(FsTypeIdmappable("tmpfs", KernelVersion{6, 1, 0}));
  EXPECT_TRUE(FsTypeIdmappable("tmpfs", KernelVersion{6, 3, 0}));
  EXPECT_FALSE(FsTypeIdmappable("nfs", KernelVersion{6, 18, 0}));
  EXPECT_EQ(AgentSocketPathLength("/var/lib/sbx"), std::string("/var/lib/sbx/sandboxes/sbx_").size() + 20 + 11);
  EXPECT_EQ(MaxSocketPathLength(), 107u);
}

TEST(DoctorPure, Wrap) {
  auto lines = WrapText("aaa bbb ccc", 7);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "aaa bbb");
  EXPECT_EQ(lines[1], "ccc");
  lines = WrapText(std::string(12, 'x'), 5);
  EXPECT_EQ(lines.size(), 3u);
  EXPECT_EQ(WrapText("one", 0).size(), 1u);
}

TEST(DoctorChild, ReportsOutputAndExit) {
  auto o = RunInChild([](int fd) { (void)!::write(fd, "hi", 2); }, std::chrono::milliseconds(5000));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->output, "hi");
  EXPECT_TRUE(o->exited);
  EXPECT_EQ(o->exit_code, 0);
  EXPECT_FALSE(o->timed_out);
}

// Proven by order, not time: the child would exit by itself after 60 s, so a report of a
// kill at the timeout (rather than of that exit) shows the 100 ms timeout was applied.
TEST(DoctorChild, HungChildIsKilledAtTheTimeout) {
  auto o = RunInChild([](int) { ::sleep(60); }, std::chrono::milliseconds(100));
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->timed_out);
  EXPECT_FALSE(o->exited) << "the child ran to its own exit: the timeout was not applied";
  EXPECT_NE(DescribeAbnormal(*o, std::chrono::milliseconds(100)).find("100 ms"), std::string::npos);
}

TEST(DoctorChild, CrashedChildIsReported) {
  // SIGTERM rather than a crash: no core dump left behind.
  auto o = RunInChild([](int) { ::kill(::getpid(), SIGTERM); ::pause(); }, std::chrono::milliseconds(5000));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->exited);
  EXPECT_EQ(o->signal, SIGTERM);
  EXPECT_NE(DescribeAbnormal(*o, std::chrono::milliseconds(5000)).find("TERM"), std::string::npos);
}

}  // namespace
}  // namespace sbx::runtime::doctor
