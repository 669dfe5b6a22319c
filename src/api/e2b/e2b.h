// The E2B-compatible API (docs/e2b.md, issue 19): the official E2B SDKs drive sbxd unchanged
// with E2B_API_URL / E2B_SANDBOX_URL pointed at its listener. A thin adapter: every call is one
// of sbx's own service calls, with E2B's request and answer shapes
// (../shared/research/e2b-compat.md has the wire protocol as the SDKs speak it).
//
// Two sides, told apart by the request (Gateway::Matches):
//   control plane  /sandboxes…, /v2/sandboxes…   X-API-KEY = a management token (tenant token)
//   envd           E2b-Sandbox-Id + E2b-Sandbox-Port headers, or Host {port}-{id}.{domain}
//                  port 49983: /health, /files, Connect-RPC /process.Process/*,
//                  /filesystem.Filesystem/*; any other port (49999: the code interpreter) goes
//                  to the sandbox's port relay. X-Access-Token = the sandbox's envd token,
//                  which acts on that one sandbox's processes and files and nothing else.
//
// Errors: errors.h is the one place that picks E2B's HTTP codes and bodies ({code, message}
// for REST, Connect's {code: "not_found", …} for RPC).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "api/api.h"
#include "api/target.h"
#include "http/server.h"
#include "service/agent_client.h"
#include "service/inputs.h"

namespace sbx::api::e2b {

using Awaitable = http::asio::awaitable<std::optional<http::Response>>;

// What envd's port answers (the SDKs send E2b-Sandbox-Port: 49983 for it).
inline constexpr uint16_t kEnvdPort = 49983;
// The envd version sbxd reports in create/connect answers: the SDKs gate features on it
// (e2b-compat.md §5.2). 0.5.7: octet-stream uploads, CloseStdin, no forced user `user`.
inline constexpr std::string_view kEnvdVersion = "0.5.7";

// One envd request, authenticated by the sandbox's envd token: the sandbox, its owner (the
// caller every service call is made as) and its running agent.
struct State;

struct EnvdCall {
  Api& api;
  State& state;
  http::RequestContext& ctx;
  const Target& target;
  service::Caller owner;
  std::string sandbox_id;
  service::AgentClient agent;
  // The user of `Authorization: Basic base64("<user>:")`; nullopt: the template's default
  // user (sbx's default, as envd's `user` is E2B's).
  std::optional<std::string> user;
};

// Who owns what an envd call makes (written files, the directories made for them, MakeDir):
// `named` (?username=) or the call's user, else the sandbox's template's default user, as
// envd gives new files to its `user`; nullopt: the agent (root). A template whose user is not
// root (code-interpreter-v1's `user`) must be able to change the files its client uploads.
std::optional<std::string> MakerOf(EnvdCall& call, const store::SandboxRecord& sb,
                                   const std::optional<std::string>& named = std::nullopt);

// E2B's name of a sandbox: its id with `-` for the `_` ("sbx-abc…"). The SDKs put it in host
// names ({port}-{id}.{domain}, the Python code interpreter always), where `_` is no host-name
// character and a wildcard certificate matches no label holding one. Every E2B route takes
// either form.
std::string E2bSandboxId(std::string_view sbx_id);
std::string SbxSandboxId(std::string_view e2b_id);

// The body of an E2B create (NewSandbox) as sbx's own (POST /v1/sandboxes), which
// ParseCreateSandbox then checks: templateID → template, timeout → timeout_s (default 300),
// metadata → labels, envVars → env, allow_internet_access (default true) → the `open` egress
// profile when `profiles` (GET /v1/egress-profiles' answer for the caller) has it, else `none`,
// network.allowPublicTraffic → public_ports. What sbx cannot do (autoPause, network rules,
// volume mounts, MCP) is a 400 naming the field, never ignored.
absl::StatusOr<nlohmann::json> TranslateCreate(const nlohmann::json& in,
                                               const nlohmann::json& profiles);

// Entry points, each in its own file (envd_process.cc, envd_filesystem.cc, envd_files.cc).
// `method` is the RPC's name ("Start", "ListDir", …).
Awaitable ProcessRpc(EnvdCall& call, std::string_view method);
Awaitable FilesystemRpc(EnvdCall& call, std::string_view method);
// GET and POST /files.
Awaitable FilesRest(EnvdCall& call);

// The variables envd gives every command: E2B_SANDBOX=true, E2B_SANDBOX_ID (E2B's spelling of
// the id), E2B_TEAM_ID (the sandbox's tenant), E2B_TEMPLATE_ID (its template). Under the
// sandbox's env and a command's envs.
nlohmann::json E2bDefaultEnv(const store::SandboxRecord& sb);
// Where a template's start process finds what envd would have given it: E2bDefaultEnv with
// the create's envs over it, as a JSON object (written by the create, 0644, when the template
// has a start process; docs/e2b.md). The code interpreter's server started before a create
// from the warm pool knew its env: its kernels read this.
inline constexpr std::string_view kSharedEnvPath = "/run/sbx/e2b/env.json";

// The gateway (gateway.cc): which requests are E2B's, their authentication and dispatch.
// A friend of Api: it uses its service, its authentication and its port relay as they are.
struct Gateway {
  // Whether `req` is for the E2B API: a control-plane path, or an envd request (by its
  // headers; by host name when `port` says the host-name route chose envd's port).
  static bool Matches(const http::Request& req);
  // Whether its body goes to the handler as a stream (POST /files: uploads of any size).
  static bool StreamsBody(const http::Request& req);
  static Awaitable Handle(Api& api, http::RequestContext& ctx);
  // An envd request that the host-name route of the port relay found ({port}-{id}.{domain}
  // with port 49983).
  static Awaitable HandleEnvd(Api& api, http::RequestContext& ctx, std::string sandbox_id);

  // Control plane (control_plane.cc), `caller` authenticated from X-API-KEY.
  static Awaitable ControlPlane(Api& api, http::RequestContext& ctx, const Target& t,
                                const service::Caller& caller);
  // Helpers the envd handlers share.
  static service::SandboxService& Service(Api& api) { return api.svc_; }
  static ResourceLimits Limits(const Api& api) { return api.limits(); }
  static Awaitable WaitForRunning(Api& api, http::RequestContext& ctx,
                                  const service::Caller& caller, const std::string& op_id);
};

}  // namespace sbx::api::e2b
