// sbx-agent's event loop: one thread, one epoll set holding a signalfd (SIGCHLD, SIGTERM,
// SIGINT), the listening socket, every client connection, every session's output pipes (or
// pty master), the stdin of sessions whose queued input waits for room (EPOLLOUT), and the
// timerfd of each session with a timeout.
//
// Sessions are keyed by the host's session_id. Each keeps an EventLog (see event_log.h); each
// attached connection has a cursor into it and a small output buffer, written non-blocking,
// so a slow client never stalls the loop or other clients. Pipes are only read while the log
// has room (back-pressure instead of loss).
//
// As PID 1 of the sandbox (or as a child subreaper elsewhere) the agent reaps every process
// that ends up its child, not only session leaders.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "agent/identity.h"
#include "protocol/limits.h"

namespace sbx::agent {

struct AgentOptions {
  int listen_fd = -1;        // an inherited, bound and listening unix socket
  std::string listen_path;   // or: bind this path ourselves
  size_t buffer_bytes = protocol::kDefaultOutputBufferBytes;  // per session and stream
  int log_fd = 2;  // JSON lines (common/log_format.h)
  std::string sandbox_id;  // for the log lines only
  // When false the `user` field of a spec is ignored and processes keep the agent's
  // credentials (the fake runtime, which runs without privileges or isolation).
  bool switch_user = true;
  // Read-only fd of the sandbox's OOM counter (oom.h); -1 turns OOM attribution off.
  int oom_counter_fd = -1;
  // The sandbox's root for file operations (files.h): "/" where the agent is PID 1 after
  // pivot_root (ns runtime), a directory of the host for the fake runtime (--root).
  std::string root = "/";
  // What relative file paths are relative to: the template's workdir.
  std::string workdir = "/";
  // Whom session processes and file workers become (identity.h): the sandbox's user
  // namespace, capability set and cgroups. Default: the agent's own.
  SandboxIdentity identity;
  // A microVM build step (vm_init.cc): its overlay upper, which export_layer streams, and the
  // guest's mux pump, which export_layer must leave alive. -1 / empty elsewhere.
  int upper_fd = -1;
  std::vector<int> spare_pids;
};

// Runs until SIGTERM/SIGINT; returns the process exit code.
int RunAgent(const AgentOptions& options);

}  // namespace sbx::agent
