// Starting a session's process: fork + exec with everything the child needs prepared before
// fork, so that the child only makes async-signal-safe calls.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/identity.h"
#include "agent/users.h"
#include "common/unique_fd.h"

namespace sbx::agent {

inline constexpr const char* kDefaultPath =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

struct SpawnSpec {
  std::vector<std::string> argv;  // non-empty; argv[0] is searched in the env's PATH
  std::string cwd = "/";
  std::vector<std::string> env;  // "KEY=value"
  std::optional<ResolvedUser> user;  // nullopt: keep the agent's own credentials (root, with identity)
  // Enters the sandbox's identity between fork and exec (identity.h); null: keep the agent's.
  const SandboxIdentity* identity = nullptr;
  // stdin on a pipe whose write end the caller keeps (otherwise /dev/null).
  bool stdin_pipe = false;
  // A pseudo-terminal instead of pipes: the child is a session leader with the pty as its
  // controlling terminal on 0-2; the caller gets the master.
  bool tty = false;
  unsigned short rows = 24, cols = 80;
};

struct SpawnedProcess {
  pid_t pid = -1;  // also the process group id
  UniqueFd stdout_fd;  // read ends, non-blocking, close-on-exec
  UniqueFd stderr_fd;   // not set for a tty
  // Write end for stdin, non-blocking, close-on-exec: a pipe, or a dup of the pty master.
  UniqueFd stdin_fd;
};

// Opens a pty pair by hand (the agent is static: no libutil): /dev/ptmx, unlocked, with the
// window size set. Returns {master, slave}; both close-on-exec, the slave without O_NOCTTY
// effects on the caller (opened O_NOCTTY, the child takes it with TIOCSCTTY).
absl::StatusOr<std::pair<UniqueFd, UniqueFd>> OpenPty(unsigned short rows, unsigned short cols);

// The session environment: `base` (the agent's environ) without SBX_AGENT_* entries,
// overlaid with `overlay`. Sorted by key.
std::vector<std::string> BuildEnv(char** base, const std::map<std::string, std::string>& overlay);

// execvpe-style candidates for argv0: argv0 itself when it contains '/', else every PATH entry
// joined with it (an empty entry means the current directory).
std::vector<std::string> ExecCandidates(const std::string& argv0, const std::string& path);

// Records which signals the calling process does not leave at SIG_DFL (SIG_IGN survives exec;
// a handler would run on the agent's memory until exec): the child of Spawn resets those
// alone, not all 64. Spawn records once by itself; call again after changing any disposition.
void RecordSignalDispositions();

// Starts the process in its own process group with stdin = /dev/null (or a pipe, see
// SpawnSpec::stdin_pipe) and stdout/stderr on fresh pipes, or with a pty (SpawnSpec::tty).
// Exec failures are reported by the child on its stderr (exit 127, 126 for cwd/credential
// failures), not here.
absl::StatusOr<SpawnedProcess> Spawn(const SpawnSpec& spec);

}  // namespace sbx::agent
