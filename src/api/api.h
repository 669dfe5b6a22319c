// The v1 HTTP API: one route table (routes.h), one parser per request body (requests.h), one
// place that renders results (render.h) and one that maps errors to HTTP (status_to_http.h). Handlers call the service layer and never block on
// runtime work: lifecycle changes become operations, data-plane calls are asynchronous.
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/port_target.h"
#include "api/upstream_pool.h"
#include "api/requests.h"
#include "api/target.h"
#include "common/byte_buffer.h"
#include "common/metrics.h"
#include "http/server.h"
#include "service/agent_client.h"
#include "service/rate_limit.h"
#include "service/sandbox_service.h"
#include "service/template_service.h"
#include "service/tenancy.h"

namespace sbx::api {

namespace e2b {
struct Gateway;
struct State;
}

struct ApiOptions {
  std::string admin_token;  // acts for tenant "default"
  ResourceLimits limits;    // the start-up value; SetLimits replaces it
  std::chrono::seconds keepalive_interval{15};
  // GET /metrics without the admin token (config key metrics.public): for a scraper on a
  // trusted network that should not hold a token that can create and delete sandboxes.
  bool metrics_public = false;
  // What GET /metrics serves and where the API's own metrics go; nullptr: metrics::Default().
  metrics::Registry* metrics = nullptr;
  // Port exposure (port_routes.cc): host-name routing {port}-{id}.{ports_domain} (empty: off),
  // and how long a connect to a sandbox port may take before the request fails with 504.
  std::string ports_domain;
  std::chrono::milliseconds port_connect_timeout{5000};
  // The `domain` of E2B's answers (e2b/control_plane.cc; config e2b.domain); empty: null.
  std::string e2b_domain;
  // A relay to a sandbox port with no byte moving either way for this long is ended.
  std::chrono::seconds port_idle_timeout{600};
  // Templates users bring (template_routes.cc); nullptr: only `base`, the routes answer 501.
  service::TemplateService* templates = nullptr;
  // Tenants and their tokens, quotas and audit log (docs/tenancy.md); nullptr: the admin token
  // alone, and the /v1/admin routes answer 501.
  service::Tenancy* tenancy = nullptr;
  // The nodes of the store (docs/scale.md), for /v1/admin/nodes; nullptr: those routes 501.
  service::Cluster* cluster = nullptr;
};

class Api {
 public:
  Api(service::SandboxService& svc, ApiOptions opts);
  // Cancels what it registered with the service (the kept connections' watches): a job that
  // finishes after this must not call into it.
  ~Api();
  http::asio::awaitable<std::optional<http::Response>> Handle(http::RequestContext& ctx);

  // Whether the server should hand `req`'s body to its handler as a stream instead of reading
  // it whole (file uploads): http::ServerOptions::stream_body.
  static bool StreamsBody(const http::Request& req);
  // Whether `req` is for a sandbox port (port_routes.cc), which streams its body too.
  bool IsPortRequest(const http::Request& req) const;
  // Whether a connection in the server's reserve (past its connection caps) may have `req`
  // served: the health probes and the admin token, so that a flood of connections cannot
  // lock out the health check and the operator (http::ServerOptions::privileged).
  bool Privileged(const http::Request& req) const;

  // For requests parsed from now on (sbxd's configuration reload); safe while requests run.
  void SetLimits(const ResourceLimits& limits);
  ResourceLimits limits() const;

 private:
  // The route table's handlers (routes.h) call the service and the members below.
  friend struct Routes;
  // The E2B-compatible API (e2b/e2b.h) is a thin adapter over the same members.
  friend struct e2b::Gateway;
  // Authenticates, matches the route table and runs the handler (routes.cc).
  http::asio::awaitable<std::optional<http::Response>> Route(http::RequestContext& ctx);
  // `created`: the session was created by this same request (POST …/sessions?attach=true);
  // the stream's head names it, as the 201 would have.
  struct CreatedHere {
    std::string session_id;
    bool replayed = false;  // an Idempotency-Key's stored answer, not a new session
  };
  http::asio::awaitable<std::optional<http::Response>> Attach(
      http::RequestContext& ctx, const service::Caller& caller, const std::string& session_id,
      const Target& target, const CreatedHere* created = nullptr);
  // Output bytes of an attach batch, counted once the client has taken it.
  struct AttachBatch {
    uint64_t stdout_bytes = 0;
    uint64_t stderr_bytes = 0;
  };
  // One event of the binary form on the wire: batch[begin, end) then `data` (output bytes
  // left where the agent stream holds them; may be empty).
  struct AttachPiece {
    size_t begin = 0;
    size_t end = 0;
    std::string_view data;
  };
  using AttachPieces = std::vector<AttachPiece>;
  // Appends the SSE form (or the binary form, recording its `pieces`) of one agent frame to
  // `batch`; false when the stream ends with it (the exit event, which is appended and
  // recorded, or a frame that does not decode, which is not).
  bool AppendAttachEvent(http::RequestContext& ctx, const std::string& session_id,
                         const service::AttachFrame& f, bool binary, ByteBuffer& batch,
                         AttachPieces& pieces, AttachBatch& counts);
  // The SSE error of an attach whose agent stream broke before the exit event: how the agent
  // ended when it died (sandbox_failed), else agent_unavailable or sandbox_not_running.
  http::asio::awaitable<nlohmann::json> AgentGoneError(http::RequestContext& ctx,
                                                       const std::string& sandbox_id,
                                                       const absl::Status& why);
  // POST /v1/sessions/{id}/{stdin,stdin:close,signal,resize} (session_io.cc).
  http::asio::awaitable<std::optional<http::Response>> SessionIo(http::RequestContext& ctx,
                                                                 const service::Caller& caller,
                                                                 const std::string& session_id,
                                                                 const std::string& action);
  // GET /v1/sessions/{id}/ws (session_ws.cc): takes the connection over.
  http::asio::awaitable<std::optional<http::Response>> WebSocket(http::RequestContext& ctx,
                                                                 const service::Caller& caller,
                                                                 const std::string& session_id);
  // GET /v1/sandboxes/{id}/processes (session_io.cc).
  http::asio::awaitable<std::optional<http::Response>> Processes(http::RequestContext& ctx,
                                                                 const service::Caller& caller,
                                                                 const std::string& sandbox_id);
  // The operation once it is finished, or as it is when `wait` runs out (wait 0: at once).
  http::asio::awaitable<absl::StatusOr<store::OperationRecord>> WaitForOperation(
      http::RequestContext& ctx, const service::Caller& caller, const std::string& id,
      std::chrono::milliseconds wait);
  // /v1/sandboxes/{id}/files[:list|:stat|:mkdir|:move] (files_api.cc); `what` is the last
  // path segment.
  http::asio::awaitable<std::optional<http::Response>> Files(http::RequestContext& ctx,
                                                             const service::Caller& caller,
                                                             const std::string& sandbox_id,
                                                             const std::string& what,
                                                             const Target& target);
  http::asio::awaitable<std::optional<http::Response>> FileDownload(
      http::RequestContext& ctx, const std::string& sandbox_id, service::AgentClient& agent,
      const std::string& path);
  http::asio::awaitable<std::optional<http::Response>> FileWatch(
      http::RequestContext& ctx, service::AgentClient& agent, service::WatchRequest request);
  // A reply the guest sizes ("processes", "list"; guest_replies.cc): under a slot of the
  // service's ReplyGate, `fetch` gets the body (rewritten without a tree by the agent
  // client), which is then streamed.
  using GuestSizedFetch = std::function<http::asio::awaitable<absl::StatusOr<std::string>>()>;
  http::asio::awaitable<std::optional<http::Response>> GuestSizedReply(
      http::RequestContext& ctx, const std::string& sandbox_id, GuestSizedFetch fetch);
  http::asio::awaitable<std::optional<http::Response>> FileUpload(
      http::RequestContext& ctx, const std::string& sandbox_id, service::AgentClient& agent,
      service::WriteRequest request, uint64_t disk_cap_bytes);
  // A stream's Unavailable as what became of the sandbox (SandboxService::ExplainAgentLoss).
  absl::Status AfterAgentLoss(const std::string& sandbox_id, absl::Status s);
  // The request of PUT /v1/sandboxes/{id}/files from its query (files_api.cc).
  static absl::StatusOr<service::WriteRequest> UploadRequest(const http::Request& req,
                                                             const Target& t, std::string path);
  // Port exposure (port_routes.cc): the port a request is for (nullopt: none), the proxy, and
  // its connection into the sandbox.
  std::optional<absl::StatusOr<PortAddress>> MatchPort(const http::Request& req) const;
  http::asio::awaitable<std::optional<http::Response>> ProxyPort(http::RequestContext& ctx,
                                                                 absl::StatusOr<PortAddress> a);
  // A kept connection to the port when `reused` is given and one is idle (*reused then true),
  // else a new one. *ipv6: whether it is an IPv6 connection (the server is on ::1).
  http::asio::awaitable<absl::StatusOr<http::asio::ip::tcp::socket>> DialUpstream(
      http::RequestContext& ctx, const PortAddress& a, bool* reused, bool* ipv6);
  // Gives `up` to upstreams_, and arranges that it is closed in time.
  void KeepUpstream(const PortAddress& a, http::asio::ip::tcp::socket& up, bool ipv6);
  void ArmUpstreamSweep(http::asio::any_io_executor ex);
  void SweepUpstreams(std::shared_ptr<http::asio::steady_timer> timer,
                      boost::system::error_code ec);
  // The bearer token (or, on a session's data plane, `?token=`): the configured admin token,
  // a tenant's management token (opts_.tenancy), or an attach token.
  absl::StatusOr<service::Principal> Authenticate(const http::Request& req,
                                                  const std::optional<std::string>& query_token,
                                                  bool allow_attach_token) const;
  // The same for a token taken from elsewhere (E2B's X-API-KEY).
  absl::StatusOr<service::Principal> AuthenticateToken(const std::string& token,
                                                       bool allow_attach_token) const;
  // Runs a mutating route's handler under its Idempotency-Key (service/idempotency.h): a
  // duplicate waits for the first and replays its answer.
  http::asio::awaitable<std::optional<http::Response>> RunIdempotent(
      http::RequestContext& ctx, const service::Caller& caller, const std::string& key,
      const struct Route& route, struct Call& call);
  // The most a streamed request's route takes of its body (an upload: the sandbox's disk
  // cap; an import or build: templates.max_archive_mib), 0 for no bound of its own: how much
  // of a duplicate's body is read to compare it with the first's.
  uint64_t StreamedBodyLimit(http::RequestContext& ctx, const service::Caller& caller,
                             const struct Call& call);
  // After the handler: the audit row of a management action (docs/tenancy.md, "Audit").
  void AuditRequest(const http::RequestContext& ctx, const service::Caller& caller,
                    const std::vector<std::string>& seg, const http::Response* res);

  service::SandboxService& svc_;
  ApiOptions opts_;  // opts_.limits only under limits_mu_
  mutable std::mutex limits_mu_;
  std::string admin_token_hash_;
  service::RateLimiter rate_limiter_;
  metrics::Registry& registry_;
  metrics::Gauge& attach_streams_;
  metrics::Counter& streamed_stdout_;
  metrics::Counter& streamed_stderr_;
  UpstreamPool upstreams_;
  // The E2B adapter's tables (e2b/state.h).
  std::unique_ptr<e2b::State> e2b_;
  std::mutex sweep_mu_;
  bool sweep_armed_ = false;  // under sweep_mu_: a sweep timer is pending
};

}  // namespace sbx::api
