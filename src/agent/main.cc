// sbx-agent: the first process of every sandbox. See agent.h for the design and
// src/protocol/protocol.h for what it speaks.
#include <sys/prctl.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>
#include <fcntl.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/vm_init.h"
#include "agent/vm_jail.h"

namespace {

void Usage(FILE* out) {
  std::fputs(
      "usage: sbx-agent (--listen-fd N | --listen PATH) [--buffer-bytes N] [--log-fd N]\n"
      "                 [--no-user-switch] [--oom-counter-fd N] [--sandbox-id ID]\n"
      "                 [--root DIR] [--workdir PATH] [--userns-fd N --caps MASK]\n"
      "                 [--cgroup-procs-fd N]... [--upper-fd N] [--spare-pid N]...\n"
      "  --listen-fd N       serve on an inherited, listening unix socket (ns runtime)\n"
      "  --listen PATH       bind and serve on a unix socket at PATH\n"
      "  or: sbx-agent --vm-bridge PORT_SOCKET LISTEN_PATH [CONNECT_LINE] [--as-uid N]  (a microVM's\n"
      "      host bridge; CONNECT_LINE: what Firecracker's vsock socket is sent first; --as-uid: confined\n"
      "      to that uid once its sockets are open)\n"
      "  or: sbx-agent --vm-jail SPEC_JSON -- QEMU ARGV...  (a microVM's VMM, jailed)\n",
      out);
  std::fprintf(out, "  --buffer-bytes N    output retained per session and stream (default %zu)\n",
               sbx::protocol::kDefaultOutputBufferBytes);
  std::fputs(
      "  --log-fd N          write logs (JSON lines) to fd N instead of stderr\n"
      "  --sandbox-id ID     the sandbox this agent serves, named on every log line\n"
      "  --no-user-switch    ignore spec.user; run processes with the agent's credentials\n"
      "  --root DIR          the sandbox's root for file operations (default /)\n"
      "  --workdir PATH      what relative file paths are relative to (default /)\n"
      "  --oom-counter-fd N  inherited read-only fd of the sandbox's memory.oom_control or\n"
      "                      memory.events: report OOM kills of sessions (default: off)\n"
      "  --userns-fd N       the sandbox's user namespace, which the agent owns but is not in:\n"
      "                      every session process and file worker enters it (identity.h)\n"
      "  --caps MASK         capabilities sandbox root keeps there (with --userns-fd)\n"
      "  --uid-map \"B N\"     its ids 0..N-1 are host B.. (to show processes' uids as inside)\n"
      "  --cgroup-procs-fd N cgroup.procs that session processes and file workers join\n"
      "                      (repeatable: one per hierarchy)\n"
      "  --upper-fd N        a microVM build step's overlay upper: serve export_layer\n"
      "  --spare-pid N       a process export_layer leaves alive (repeatable)\n",
      out);
}

bool ParseNumber(const char* s, long long min, long long max, long long* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The initramfs of a microVM runs this binary as /init (docs/microvm.md).
  if (::getpid() == 1 && argc == 1) return sbx::agent::RunVmInit();
  if (argc >= 4 && std::string(argv[1]) == "--vm-bridge") {
    // PORT LISTEN [CONNECT_LINE] [--as-uid N]
    std::vector<std::string> rest(argv + 2, argv + argc);
    uint32_t as_uid = 0;
    if (rest.size() >= 4 && rest[rest.size() - 2] == "--as-uid") {
      long long n = 0;
      if (!ParseNumber(rest.back().c_str(), 1, UINT32_MAX - 1, &n)) {
        std::fprintf(stderr, "sbx-agent --vm-bridge: bad --as-uid\n");
        return 2;
      }
      as_uid = static_cast<uint32_t>(n);
      rest.resize(rest.size() - 2);
    }
    if (rest.size() != 2 && rest.size() != 3) {
      Usage(stderr);
      return 2;
    }
    return sbx::agent::RunVmBridge(rest[0], rest[1], rest.size() == 3 ? rest[2] : "", as_uid);
  }
  if (argc >= 5 && std::string(argv[1]) == "--vm-jail" && std::string(argv[3]) == "--") {
    return sbx::agent::RunVmJail(argv[2], std::vector<std::string>(argv + 4, argv + argc));
  }
  // Sandbox root runs with the agent's uid, so without this it could open /proc/1/mem (rewrite
  // the agent), /proc/1/fd/* (the host-side agent.log, the socket sbxd talks on) and ptrace it.
  // Non-dumpable makes those need CAP_SYS_PTRACE, which no sandbox process has. Children get
  // their dumpable flag back at exec.
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    std::fprintf(stderr, "sbx-agent: prctl(PR_SET_DUMPABLE, 0): %s\n", std::strerror(errno));
    return 1;
  }
  sbx::agent::AgentOptions opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "sbx-agent: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](const char* name, long long min, long long max) -> long long {
      long long n = 0;
      if (!ParseNumber(value(name), min, max, &n)) {
        std::fprintf(stderr, "sbx-agent: bad %s\n", name);
        std::exit(2);
      }
      return n;
    };
    if (arg == "--listen-fd") {
      opts.listen_fd = static_cast<int>(number("--listen-fd", 0, 1 << 20));
    } else if (arg == "--listen") {
      opts.listen_path = value("--listen");
    } else if (arg == "--buffer-bytes") {
      opts.buffer_bytes = static_cast<size_t>(number("--buffer-bytes", 1, 1LL << 40));
    } else if (arg == "--log-fd") {
      opts.log_fd = static_cast<int>(number("--log-fd", 0, 1 << 20));
    } else if (arg == "--oom-counter-fd") {
      opts.oom_counter_fd = static_cast<int>(number("--oom-counter-fd", 0, 1 << 20));
    } else if (arg == "--sandbox-id") {
      opts.sandbox_id = value("--sandbox-id");
    } else if (arg == "--root") {
      opts.root = value("--root");
    } else if (arg == "--workdir") {
      opts.workdir = value("--workdir");
    } else if (arg == "--userns-fd") {
      opts.identity.userns_fd = static_cast<int>(number("--userns-fd", 0, 1 << 20));
    } else if (arg == "--uid-map") {
      // "BASE COUNT": ids 0..COUNT-1 of the user namespace are host BASE.. (ps-style views).
      unsigned long long base = 0, count = 0;
      if (std::sscanf(value("--uid-map"), "%llu %llu", &base, &count) != 2 || base > UINT32_MAX ||
          count > UINT32_MAX) {
        std::fprintf(stderr, "sbx-agent: bad --uid-map (want \"BASE COUNT\")\n");
        return 2;
      }
      opts.identity.uid_base = static_cast<uint32_t>(base);
      opts.identity.uid_count = static_cast<uint32_t>(count);
    } else if (arg == "--caps") {
      auto caps = sbx::agent::ParseCapsMask(value("--caps"));
      if (!caps.ok()) {
        std::fprintf(stderr, "sbx-agent: %s\n", std::string(caps.status().message()).c_str());
        return 2;
      }
      opts.identity.caps = *caps;
    } else if (arg == "--cgroup-procs-fd") {
      opts.identity.cgroup_procs_fds.push_back(static_cast<int>(number("--cgroup-procs-fd", 0, 1 << 20)));
    } else if (arg == "--upper-fd") {
      opts.upper_fd = static_cast<int>(number("--upper-fd", 3, 1 << 20));
      // Sessions must not inherit it: from the upper's disk, ".." leads out of the root.
      if (::fcntl(opts.upper_fd, F_SETFD, FD_CLOEXEC) != 0) {
        std::fprintf(stderr, "sbx-agent: --upper-fd %d: %s\n", opts.upper_fd, std::strerror(errno));
        return 2;
      }
    } else if (arg == "--spare-pid") {
      opts.spare_pids.push_back(static_cast<int>(number("--spare-pid", 2, 1 << 22)));
    } else if (arg == "--no-user-switch") {
      opts.switch_user = false;
    } else if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "sbx-agent: unknown argument %s\n", arg.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if ((opts.listen_fd >= 0) == !opts.listen_path.empty()) {
    std::fprintf(stderr, "sbx-agent: exactly one of --listen-fd and --listen is required\n");
    Usage(stderr);
    return 2;
  }
  return sbx::agent::RunAgent(opts);
}
