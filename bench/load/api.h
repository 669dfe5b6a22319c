// The sbx API calls the scenarios are made of, on one HttpConn: create/wait/delete a sandbox,
// open a session and attach to it until the process exits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "load/http_conn.h"
#include "load/stats.h"

namespace sbx::load {

struct Created {
  std::string sandbox_id;
  std::string operation_id;
  bool warm_pool = false;  // the create response's operation said result.warm_pool: true
};

struct Session {
  std::string id;
  std::string attach_url;
  std::string attach_token;
  // Non-empty: the session is not made yet; attaching POSTs this body to attach_url (a create
  // with `?attach=true`), which makes it and answers with its stream in one request.
  std::string create_body;
};

struct AttachResult {
  std::optional<Clock::time_point> first_stdout;  // when the first stdout event arrived
  Clock::time_point exited;                       // when process_exited arrived
  uint64_t stdout_bytes = 0;
  std::string stdout_head;  // the first bytes of stdout (up to kHeadBytes), to check output
  nlohmann::json exit;      // the process_exited payload
  static constexpr size_t kHeadBytes = 4096;
};

// The fields of a stdout/stderr event's data, {"data_b64": "…", "offset": N}. A scan rather
// than a JSON parse: at 1 GiB of output the client's parsing would otherwise be what the
// throughput scenario measures. nullopt when the shape is not the expected one.
struct ChunkFields {
  std::string_view data_b64;
  uint64_t offset = 0;
};
std::optional<ChunkFields> ScanChunkEvent(std::string_view data);

class Api {
 public:
  explicit Api(HttpConn& conn) : conn_(conn) {}
  HttpConn& conn() { return conn_; }

  absl::StatusOr<Created> CreateSandbox(const nlohmann::json& body = {{"template", "base"}});
  // Long-polls the operation (server side, ?wait_ms=30000) until it succeeded; a failed
  // operation is an error carrying its message.
  absl::StatusOr<nlohmann::json> WaitOperation(const std::string& op_id);
  // Creates a sandbox and waits until it is running.
  absl::StatusOr<Created> CreateRunning(const nlohmann::json& body = {{"template", "base"}});
  // DELETE; returns the delete operation's id.
  absl::StatusOr<std::string> StartDelete(const std::string& sandbox_id);
  absl::Status DeleteAndWait(const std::string& sandbox_id);
  absl::StatusOr<Session> CreateSession(const std::string& sandbox_id,
                                        const std::vector<std::string>& argv);
  // Attaches (which starts the process) and reads the stream to process_exited, decoding every
  // stdout chunk and checking that offsets are contiguous.
  absl::StatusOr<AttachResult> Attach(const Session& session);
  // The same on the binary form (?format=binary, docs/api.md): frames parsed as they arrive,
  // ids consecutive and stdout offsets contiguous, the control frames' JSON parsed.
  absl::StatusOr<AttachResult> AttachBinary(const Session& session);
  // The session of CreateAndAttach: made by the attach request itself.
  Session SessionToCreate(const std::string& sandbox_id, const std::vector<std::string>& argv);
  // How an exec reaches the process: one request (POST …/sessions?attach=true, what `sbx exec`
  // sends) or two (POST …/sessions, then GET its attach URL).
  enum class ExecForm { kOneRequest, kTwoRequests };
  // The session made and attached to, and the process must exit 0.
  absl::StatusOr<AttachResult> Exec(const std::string& sandbox_id,
                                    const std::vector<std::string>& argv, bool binary = false,
                                    ExecForm form = ExecForm::kOneRequest);

 private:
  HttpConn& conn_;
};

}  // namespace sbx::load
