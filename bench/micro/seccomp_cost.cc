// sbx-seccomp-cost: what the sandbox's seccomp filter costs. Prints the time to compile the
// embedded policy (BuildSeccompProgram, once per sbxd start) and the time of getppid() per
// call in forked children without a filter and with the sandbox's filters installed (both
// children set no_new_privs, so only the filter differs). Numbers are reports, not assertions:
// run it a few times on an idle machine and compare medians.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/ns/landlock.h"
#include "runtime/ns/seccomp.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per getppid() over `calls` calls, measured in a fresh child (so each filter is installed
// only where it is measured).
double GetppidNs(const sbx::runtime::ns::SeccompProgram* prog, int calls) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(1);
    if (prog != nullptr && sbx::runtime::ns::InstallSeccomp(*prog) != 0) ::_exit(2);
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) ::syscall(SYS_getppid);
    double m = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
    if (::write(fds[1], &m, sizeof(m)) != sizeof(m)) ::_exit(3);
    ::_exit(0);
  }
  ::close(fds[1]);
  double m = -1;
  if (::read(fds[0], &m, sizeof(m)) != sizeof(m)) m = -1;
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return m;
}

// µs of `step` (after no_new_privs) in a fresh child, the way the launch child runs it.
template <typename F>
double ChildStepUs(F step) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(1);
    auto t0 = Clock::now();
    if (step() != 0) ::_exit(2);
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (::write(fds[1], &us, sizeof(us)) != sizeof(us)) ::_exit(3);
    ::_exit(0);
  }
  ::close(fds[1]);
  double us = -1;
  if (::read(fds[0], &us, sizeof(us)) != sizeof(us)) us = -1;
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 31;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 200000;

  std::vector<double> build_us;
  size_t main_len = 0, hand_len = 0;
  for (int i = 0; i < 51; ++i) {
    auto t0 = Clock::now();
    auto prog = sbx::runtime::ns::BuildSeccompProgram();
    build_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!prog.ok()) {
      std::fprintf(stderr, "BuildSeccompProgram: %s\n", std::string(prog.status().message()).c_str());
      return 1;
    }
    main_len = prog->main.size();
    hand_len = prog->handwritten.size();
  }
  auto prog = sbx::runtime::ns::BuildSeccompProgram();
  std::printf("BuildSeccompProgram: median %.0f us (min %.0f) over %zu runs; filters: %zu + %zu instructions\n",
              Median(build_us), *std::min_element(build_us.begin(), build_us.end()), build_us.size(),
              main_len, hand_len);
  // What the launch child pays per sandbox.
  const sbx::runtime::ns::LandlockPlan landlock = sbx::runtime::ns::BuildLandlockPlan();
  std::vector<double> install_us, landlock_us;
  for (int i = 0; i < 31; ++i) {
    install_us.push_back(ChildStepUs([&] { return sbx::runtime::ns::InstallSeccomp(*prog); }));
    landlock_us.push_back(ChildStepUs([&] { return sbx::runtime::ns::ApplyLandlock(landlock); }));
  }
  std::printf("per launch (median of 31 children): InstallSeccomp %.0f us; ApplyLandlock %.0f us (%s)\n",
              Median(install_us), Median(landlock_us), sbx::runtime::ns::DescribeLandlockPlan(landlock).c_str());

  // The fixed cost of having any filter (the syscall entry's slow path) vs the cost of ours.
  sbx::runtime::ns::SeccompProgram allow_all;
  allow_all.main = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
  allow_all.handwritten = allow_all.main;
  sbx::runtime::ns::SeccompProgram main_only = *prog;
  main_only.handwritten = allow_all.main;
  // Rounds interleave the variants, so that load from other processes drifts into all of them
  // alike; the medians are compared.
  const sbx::runtime::ns::SeccompProgram* variants[] = {nullptr, &allow_all, &main_only, &*prog};
  std::vector<double> ns[4];
  for (int r = 0; r < rounds; ++r) {
    for (int v = 0; v < 4; ++v) ns[v].push_back(GetppidNs(variants[v], calls));
  }
  const double off = Median(ns[0]), trivial = Median(ns[1]), main_on = Median(ns[2]), on = Median(ns[3]);
  std::printf("getppid() ns/call, median of %d interleaved rounds of %d calls: no filter %.1f; two allow-all "
              "filters %.1f (%+.1f); libseccomp filter + allow-all %.1f (%+.1f); sandbox filters %.1f (%+.1f)\n",
              rounds, calls, off, trivial, trivial - off, main_on, main_on - off, on, on - off);
  return off < 0 || on < 0 ? 1 : 0;
}
