// envd's process.Process service (e2b-compat.md §8): the pure parts, shared by its files
// (envd_process.cc: the unary RPCs and the dispatch; envd_process_stream.cc: Start and
// Connect) and tested alone (envd_process_test.cc). Every function takes untrusted proto3 JSON
// (connect.h's rules: camelCase or snake_case, enums by name or number, ints as numbers or
// strings, bytes in either base64) and answers InvalidArgument naming the field, never throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "api/e2b/connect.h"
#include "api/e2b/e2b.h"
#include "api/e2b/process_table.h"
#include "service/agent_types.h"

namespace sbx::api::e2b {

struct PtySize {
  int64_t rows = 0;
  int64_t cols = 0;
};

// StartRequest {process: ProcessConfig, pty?: {size}, tag?, stdin?}.
struct StartSpec {
  ProcessConfigInfo config;
  std::optional<PtySize> pty;
  std::optional<std::string> tag;
  bool stdin = false;
};
absl::StatusOr<StartSpec> ParseStart(const nlohmann::json& msg);

// sbx's own session body (POST /v1/sandboxes/{id}/sessions), for ParseCreateSession to check:
// argv = [cmd, args...], env, cwd, user, tty {rows, cols}, stdin, and `timeout_ms` (the
// Start's Connect-Timeout-Ms) as timeout_s (rounded up, at most 30 days) with no grace: envd
// kills the process at its deadline. `defaults` (E2bDefaultEnv) go under the command's envs.
nlohmann::json SessionBody(const StartSpec& s, const std::optional<std::string>& user,
                           std::optional<int64_t> timeout_ms,
                           const nlohmann::json& defaults = nlohmann::json::object());

// ProcessSelector {pid | tag}, the `process` field of Connect, SendInput, SendSignal,
// CloseStdin, Update and StreamInput's start.
struct Selector {
  std::optional<int64_t> pid;
  std::optional<std::string> tag;
  std::string Describe() const;  // "process with pid 7" / "process with tag \"x\""
};
absl::StatusOr<Selector> ParseSelector(const nlohmann::json& msg);

// SendSignalRequest.signal: SIGNAL_SIGKILL / SIGNAL_SIGTERM (or any SIG name the agent
// knows), or a number.
absl::StatusOr<int> ParseSignal(const nlohmann::json& msg);

// ProcessInput {stdin | pty}: the bytes (either kind writes the process's input).
absl::StatusOr<std::string> ParseInput(const nlohmann::json& input, std::string_view field);

// PTY {size: {cols, rows}} (both 1..1000, sbx's terminal bounds).
absl::StatusOr<PtySize> ParsePty(const nlohmann::json& pty, std::string_view field);

// Connect-Timeout-Ms (1..10 digits; nullopt when absent) and Keepalive-Ping-Interval (the
// interval of keepalive events: the header's seconds, at most `cap`, default `cap`).
absl::StatusOr<std::optional<int64_t>> ParseTimeoutMs(std::optional<std::string_view> header);
std::chrono::milliseconds KeepaliveInterval(std::optional<std::string_view> header,
                                            std::chrono::milliseconds cap);

// The events of a stream (StartResponse / ConnectResponse).
nlohmann::json StartEvent(int64_t pid);
// `kind` is "stdout", "stderr" or "pty".
nlohmann::json DataEvent(std::string_view kind, std::string_view bytes);
nlohmann::json KeepaliveEvent();
// EndEvent as envd's (Go's os.ProcessState): exitCode (-1 for a signal), exited, status
// "exit status N" / "signal: killed", error = status unless it exited 0.
nlohmann::json EndEvent(const service::SessionExit& exit);
// Go's ProcessState.String() of that exit.
std::string ExitStatusText(const service::SessionExit& exit);

// A process that never ran: the agent's child reports a failed chdir (126) or exec (127) on
// stderr as "sbx-agent: <step> <what>: <error>" before it exits. The error the Start stream
// ends with (not_found for a command that does not exist, invalid_argument otherwise), or
// nullopt for a process that ran.
std::optional<RpcError> SpawnFailure(const service::SessionExit& exit, std::string_view stderr_text);
// Whether output that begins so may be such a report (worth waiting a moment for the exit).
bool MayBeSpawnFailure(std::string_view stderr_text);

// The messages of a client stream (StreamInput): envelopes, each a JSON object, up to an
// optional end-of-stream envelope. At most `max_messages`.
absl::StatusOr<std::vector<nlohmann::json>> ParseClientStream(std::string_view body,
                                                              size_t max_messages);

// ProcessInfo of List.
nlohmann::json ProcessInfoJson(int64_t pid, const ProcessConfigInfo& config,
                               const std::optional<std::string>& tag);
// The config of a session not started by E2B, from its stored spec ({argv, cwd, env}).
ProcessConfigInfo ConfigFromSpec(const nlohmann::json& spec);

// The entry points of the two streams (envd_process_stream.cc).
Awaitable ProcessStart(EnvdCall& call);
Awaitable ProcessConnect(EnvdCall& call);
// The session a selector names in the call's sandbox: the table, else the agent's process
// list (for a pid). not_found when none, or when it has exited. (envd_process.cc)
http::asio::awaitable<absl::StatusOr<ProcessEntry>> ResolveProcess(EnvdCall& call,
                                                                   Selector sel);
// An agent error of a call on a resolved process, as envd's: the session gone or over is
// not_found.
RpcError ProcessCallError(const absl::Status& s, const Selector& sel);

}  // namespace sbx::api::e2b
