// Pieces shared by the command groups: the parsed global context, output helpers, K=V flags,
// operation polling and exit-code mapping.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/client.h"
#include "common/status_util.h"

namespace sbx::cli {

// Exit codes of sbx itself (a command's own exit code is passed through by run/exec/attach).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A usage error found after parsing (bad K=V, missing command): main prints it and exits 2.
struct UsageError {
  std::string message;
};

// What the chosen subcommand does once a client exists. Errors are printed by main as one
// "sbx: …" line and exit 1; the int is the exit code otherwise.
using Action = std::function<absl::StatusOr<int>(Client&)>;

struct Context {
  std::string url_flag;
  std::string token_flag;
  std::string cacert_flag;
  Action action;
  bool needs_client = true;
  std::vector<UsageError> usage_errors;
};

void RegisterSandboxCommands(CLI::App& app, Context& ctx);
// egress_cmds.cc: `sbx egress ID`, and one --allow value as an egress rule.
void RegisterEgressCommand(CLI::App& app, Context& ctx);
absl::StatusOr<nlohmann::json> ParseAllowFlag(const std::string& spec);
// port_cmds.cc: `sbx port ID PORT`.
void RegisterPortCommand(CLI::App& app, Context& ctx);
void RegisterSessionCommands(CLI::App& app, Context& ctx);
// `sbx cp`, `sbx files …` (files_cmds.cc); transfers open their own connection with *token
// (read when the command runs, after main has found the token).
void RegisterFilesCommands(CLI::App& app, Context& ctx, const std::string* token);
// "sbx_…:PATH" -> (sandbox id, path, "/" when empty); nullopt when `arg` is not one.
std::optional<std::pair<std::string, std::string>> ParseRemotePath(const std::string& arg);
// Prints a directory listing of a sandbox (`sbx ls ID:PATH`, `sbx files ls`).
absl::StatusOr<int> ListFiles(Client& client, const std::string& id, const std::string& path,
                              int depth, bool json_out);
// POSTs the local file `local` as the body of `target` (a fresh connection, streamed, with a
// progress line on stderr when `progress_on`); the JSON answer, or the API's error.
absl::StatusOr<nlohmann::json> PostFile(Client& client, const std::string& token,
                                        const std::string& target, const std::string& local,
                                        const std::string& content_type, bool progress_on);
// POSTs a tar of the local directory `dir` (names relative to it) as the body of `target`,
// chunked; the JSON answer, or the API's error.
absl::StatusOr<nlohmann::json> PostDirectoryTar(Client& client, const std::string& token,
                                                const std::string& target, const std::string& dir,
                                                bool progress_on);
// `sbx template …` (template_cmds.cc).
void RegisterTemplateCommands(CLI::App& app, Context& ctx, const std::string* token);
// `sbx doctor`: local, links the doctor library (the only command that does not talk HTTP).
void RegisterDoctorCommand(CLI::App& app, Context& ctx);
// admin_cmds.cc
void RegisterAdminCommands(CLI::App& app, Context& ctx);

// The message of a status as a std::string (fmt cannot format Debian's absl::string_view).
inline std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Writes all of `data` to `fd` (unbuffered, binary-safe, retrying on EINTR).
absl::Status WriteAll(int fd, std::string_view data);
// "sbx: <message>\n" on stderr.
void PrintError(std::string_view message);
void PrintError(const absl::Status& status);
void PrintJson(const nlohmann::json& j);

// Parses ["K=V", …] into a map; the flag name is used in the error message.
absl::StatusOr<std::map<std::string, std::string>> ParseKeyValues(
    const std::vector<std::string>& items, std::string_view flag);

// Checks that `id` looks like an id of the given kind ("sbx", "op", "ses") before it is put
// into a URL path.
absl::Status CheckId(std::string_view id, std::string_view prefix);

// Polls GET /v1/operations/{id} (backoff 2 ms → 100 ms) until the operation is done. `initial`
// is the operation as already known (e.g. from a 202 body) and may already be done. Returns the
// final operation; a failed operation is an error carrying its code and message.
// `each`, when set, sees the operation at every poll (every ~0.5 s): progress of long work.
absl::StatusOr<nlohmann::json> WaitOperation(
    Client& client, const nlohmann::json& initial, std::chrono::seconds timeout,
    const std::function<void(const nlohmann::json&)>& each = {});

// The number of a signal named "SIGKILL" (or "KILL", or "9"); 0 when unknown.
int SignalNumber(std::string_view name);

// Returns the string at `key` in an object, or "" when missing or not a string.
std::string JsonString(const nlohmann::json& j, std::string_view key);

// Streams an attach response to stdout/stderr until process_exited and returns the exit code
// the caller should exit with. Reconnects with Last-Event-ID when the connection breaks.
struct AttachTarget {
  std::string session_id;
  std::string url;            // attach path; "" → /v1/sessions/{id}/attach
  std::string token;          // attach token; "" → the client's management token
  std::string last_event_id;  // resume after this event
  // `sbx exec`: the session is created by the first request, which answers with its stream
  // (POST {create_path}?attach=true with this body); session_id is then learnt from it.
  std::string create_path;
  std::string create_body;
  std::string idempotency_key;
};
// `target.session_id` is set once a create's stream has named the session (also on failure,
// when it got that far).
absl::StatusOr<int> StreamSession(Client& client, AttachTarget& target);

}  // namespace sbx::cli
