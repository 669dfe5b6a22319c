// `sbx exec -i` / `-it`: a session over GET /v1/sessions/{id}/ws (Boost.Beast websocket).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "cli/client.h"

namespace sbx::cli {

// The window size of the terminal on `fd` as {rows, cols}; nullopt when it is not a terminal.
std::optional<std::pair<int, int>> TerminalSize(int fd);

// Attaches to the session's WebSocket (which starts the process) with `token` and runs it to
// its end: local stdin goes to the session (EOF becomes stdin:close), output to stdout and
// stderr. With `tty` and a terminal on stdin, that terminal is in raw mode until return (every
// path), and SIGWINCH becomes a resize. Returns the remote exit code (128+N for signal N), or
// 128+signal when interrupted by SIGINT/SIGTERM/SIGHUP (the session keeps running).
absl::StatusOr<int> RunWebSocketSession(const Endpoint& endpoint, const std::string& token,
                                        const std::string& session_id, bool tty);

}  // namespace sbx::cli
