// `sbx admin tenant|token|audit|nodes|node` (docs/tenancy.md, docs/scale.md): the /v1/admin routes. Every answer is
// printed as JSON but a created token, whose secret is printed alone on stdout (it is shown
// once) with its id on stderr.
#include <chrono>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"
#include "cli/client.h"
#include "common/status_util.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

// --quota KEY=N and --rate/--burst into a tenant body.
absl::StatusOr<json> TenantBody(const std::string& name, const std::vector<std::string>& quotas,
                                double rate, int64_t burst,
                                const std::vector<std::string>& egress_profiles,
                                bool all_egress_profiles) {
  json body = json::object();
  if (!name.empty()) body["name"] = name;
  if (!quotas.empty()) {
    json q = json::object();
    for (const std::string& kv : quotas) {
      const size_t eq = kv.find('=');
      int64_t n = -1;
      if (eq != std::string::npos) {
        try {
          size_t used = 0;
          n = std::stoll(kv.substr(eq + 1), &used);
          if (used != kv.size() - eq - 1) n = -1;
        } catch (const std::exception&) {
          n = -1;
        }
      }
      if (eq == std::string::npos || n < 0) {
        return absl::InvalidArgumentError(
            fmt::format("--quota {}: expected KEY=N (e.g. max_sandboxes=10)", kv));
      }
      q["max_" + kv.substr(0, eq).substr(kv.rfind("max_", 0) == 0 ? 4 : 0)] = n;
    }
    body["quotas"] = q;
  }
  if (rate > 0) {
    body["rate_limit"] = {{"requests_per_s", rate}};
    if (burst > 0) body["rate_limit"]["burst"] = burst;
  }
  if (all_egress_profiles && !egress_profiles.empty()) {
    return absl::InvalidArgumentError("--egress-profiles and --all-egress-profiles exclude each other");
  }
  if (all_egress_profiles) body["egress_profiles"] = nullptr;
  if (!egress_profiles.empty()) body["egress_profiles"] = egress_profiles;
  return body;
}

Action Call(std::string method, std::string path, std::shared_ptr<json> body = nullptr) {
  return [method, path, body](Client& client) -> absl::StatusOr<int> {
    auto res = client.Request(method, path, body ? body.get() : nullptr);
    if (!res.ok()) return res.status();
    PrintJson(res->body);
    return 0;
  };
}

void RegisterTenant(CLI::App& admin, Context& ctx) {
  CLI::App* tenant = admin.add_subcommand("tenant", "Tenants: create, list, show, change, delete");
  tenant->require_subcommand(1);
  struct Flags {
    std::string id, name;
    std::vector<std::string> quotas;
    double rate = 0;
    int64_t burst = 0;
    std::vector<std::string> egress_profiles;
    bool all_egress_profiles = false;
  };
  auto f = std::make_shared<Flags>();
  auto add_limits = [f](CLI::App* cmd) {
    cmd->add_option("--quota", f->quotas,
                    "KEY=N, repeatable: sandboxes, vcpu, memory_mib, disk_mib, "
                    "sessions_per_sandbox, templates, template_bytes (max_ optional)");
    cmd->add_option("--rate", f->rate, "Requests per second per token");
    cmd->add_option("--burst", f->burst, "Requests at once above the rate");
    cmd->add_option("--egress-profiles", f->egress_profiles,
                    "The egress profiles its sandboxes and builds may use (comma-separated; "
                    "`none` is always allowed); default: every profile")
        ->delimiter(',');
    cmd->add_flag("--all-egress-profiles", f->all_egress_profiles,
                  "Allow every egress profile of the deployment again");
  };
  CLI::App* create = tenant->add_subcommand("create", "Create a tenant and print it");
  create->add_option("name", f->name, "Its name")->required();
  add_limits(create);
  create->callback([f, &ctx] {
    auto body = TenantBody(f->name, f->quotas, f->rate, f->burst, f->egress_profiles,
                           f->all_egress_profiles);
    ctx.action = [body](Client& client) -> absl::StatusOr<int> {
      if (!body.ok()) return body.status();
      return Call("POST", "/v1/admin/tenants", std::make_shared<json>(*body))(client);
    };
  });
  tenant->add_subcommand("ls", "List tenants")->callback([&ctx] {
    ctx.action = Call("GET", "/v1/admin/tenants");
  });
  CLI::App* get = tenant->add_subcommand("get", "Show a tenant and what it holds");
  get->add_option("id", f->id, "ten_… or default")->required();
  get->callback([f, &ctx] { ctx.action = Call("GET", "/v1/admin/tenants/" + UrlEncode(f->id)); });
  CLI::App* update = tenant->add_subcommand("update", "Change a tenant (--quota replaces all quotas)");
  update->add_option("id", f->id, "ten_…")->required();
  update->add_option("--name", f->name, "A new name");
  add_limits(update);
  update->callback([f, &ctx] {
    auto body = TenantBody(f->name, f->quotas, f->rate, f->burst, f->egress_profiles,
                           f->all_egress_profiles);
    const std::string path = "/v1/admin/tenants/" + UrlEncode(f->id);
    ctx.action = [body, path](Client& client) -> absl::StatusOr<int> {
      if (!body.ok()) return body.status();
      return Call("PATCH", path, std::make_shared<json>(*body))(client);
    };
  });
  CLI::App* rm = tenant->add_subcommand("rm", "Delete a tenant: its tokens at once, its sandboxes as operations");
  rm->add_option("id", f->id, "ten_…")->required();
  rm->callback([f, &ctx] { ctx.action = Call("DELETE", "/v1/admin/tenants/" + UrlEncode(f->id)); });
}

void RegisterToken(CLI::App& admin, Context& ctx) {
  CLI::App* token = admin.add_subcommand("token", "Management tokens: create, list, revoke");
  token->require_subcommand(1);
  struct Flags {
    std::string tenant, name, id;
    std::vector<std::string> scopes;
    int64_t expires_in = 0;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* create = token->add_subcommand(
      "create", "Mint a token; prints its secret (shown once) on stdout, its id on stderr");
  create->add_option("tenant", f->tenant, "ten_… or default")->required();
  create->add_option("--name", f->name, "What it is for")->required();
  create->add_option("--scope", f->scopes,
                     "read, sandboxes, sessions, files, templates, admin (repeatable)")
      ->required();
  create->add_option("--expires-in", f->expires_in, "Seconds until it expires (default: never)");
  create->callback([f, &ctx] {
    auto body = std::make_shared<json>(json{{"name", f->name}, {"scopes", f->scopes}});
    if (f->expires_in > 0) (*body)["expires_in_s"] = f->expires_in;
    const std::string path = "/v1/admin/tenants/" + UrlEncode(f->tenant) + "/tokens";
    ctx.action = [body, path](Client& client) -> absl::StatusOr<int> {
      auto res = client.Request("POST", path, body.get());
      if (!res.ok()) return res.status();
      const json t = res->body.value("token", json::object());
      PrintError(fmt::format("token {} of tenant {} ({}); its secret is shown this once",
                             JsonString(t, "id"), JsonString(t, "tenant_id"),
                             t.value("scopes", json::array()).dump()));
      SBX_RETURN_IF_ERROR(WriteAll(1, JsonString(t, "token") + "\n"));
      return 0;
    };
  });
  CLI::App* ls = token->add_subcommand("ls", "List a tenant's tokens (never their secrets)");
  ls->add_option("tenant", f->tenant, "ten_… or default")->required();
  ls->callback([f, &ctx] {
    ctx.action = Call("GET", "/v1/admin/tenants/" + UrlEncode(f->tenant) + "/tokens");
  });
  CLI::App* revoke = token->add_subcommand("revoke", "Revoke a token (the next request with it is 401)");
  revoke->add_option("id", f->id, "tok_…")->required();
  revoke->callback([f, &ctx] { ctx.action = Call("DELETE", "/v1/admin/tokens/" + UrlEncode(f->id)); });
}

void RegisterAudit(CLI::App& admin, Context& ctx) {
  struct Flags {
    std::string tenant, since;
    int limit = 100;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* audit = admin.add_subcommand("audit", "Print audit rows (JSON), oldest first");
  audit->add_option("--tenant", f->tenant, "Only this tenant's");
  audit->add_option("--since", f->since, "RFC 3339 time");
  audit->add_option("--limit", f->limit, "Rows (1..500)");
  audit->callback([f, &ctx] {
    std::string q = fmt::format("/v1/admin/audit?limit={}", f->limit);
    if (!f->tenant.empty()) q += "&tenant=" + UrlEncode(f->tenant);
    if (!f->since.empty()) q += "&since=" + UrlEncode(f->since);
    ctx.action = Call("GET", q);
  });
}

void RegisterAttachKeys(CLI::App& admin, Context& ctx) {
  auto rotate = std::make_shared<bool>(false);
  CLI::App* keys = admin.add_subcommand("attach-keys", "Print the attach-token signing keys (ids, times)");
  keys->add_flag("--rotate", *rotate, "Sign with a new key from now on (the previous one still "
                                      "verifies for one attach-token lifetime)");
  keys->callback([rotate, &ctx] {
    ctx.action = *rotate ? Call("POST", "/v1/admin/attach-keys:rotate")
                         : Call("GET", "/v1/admin/attach-keys");
  });
}

// `sbx admin nodes` and `sbx admin node drain|activate` (docs/scale.md).
void RegisterNodes(CLI::App& admin, Context& ctx) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* nodes = admin.add_subcommand("nodes", "List the nodes: state, heartbeat, load");
  nodes->add_flag("--json", *as_json, "Print the answer as JSON");
  nodes->callback([as_json, &ctx] {
    ctx.action = [as_json](Client& client) -> absl::StatusOr<int> {
      auto res = client.Request("GET", "/v1/admin/nodes", nullptr);
      if (!res.ok()) return res.status();
      if (*as_json) {
        PrintJson(res->body);
        return 0;
      }
      fmt::print("{:<24} {:<9} {:<6} {:>9} {:>13} {:>17} {:>10}\n", "NAME", "STATE", "ALIVE",
                 "SANDBOXES", "VCPU", "MEMORY_MIB", "HEARTBEAT");
      for (const json& n : res->body.value("nodes", json::array())) {
        const json load = n.value("load", json::object());
        const json cap = n.value("capacity", json::object());
        auto pair = [&](const char* k) {
          return fmt::format("{}/{}", load.value(k, int64_t{0}), cap.value(k, int64_t{0}));
        };
        // A node away for a restart shows as such until its deadline.
        const bool restarting = n.contains("restart_by") && n["restart_by"].is_string();
        fmt::print("{:<24} {:<9} {:<6} {:>9} {:>13} {:>17} {:>8}ms\n", n.value("name", ""),
                   n.value("state", ""), restarting ? "restart" : n.value("alive", false) ? "yes" : "no",
                   n.value("sandboxes", int64_t{0}), pair("vcpu"), pair("memory_mib"),
                   n.value("heartbeat_age_ms", int64_t{0}));
      }
      return 0;
    };
  });

  CLI::App* node = admin.add_subcommand("node", "One node: drain it, or put it back");
  node->require_subcommand(1);
  struct Flags {
    std::string name;
    bool wait = false;
    int64_t timeout_s = 3600;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* drain = node->add_subcommand(
      "drain", "Stop placing sandboxes on the node; with --wait, wait until it holds none");
  drain->add_option("name", f->name, "The node's name (sbx admin nodes)")->required();
  drain->add_flag("--wait", f->wait, "Wait until its sandboxes have ended (deleted elsewhere)");
  drain->add_option("--timeout", f->timeout_s, "With --wait: give up after this many seconds");
  drain->callback([f, &ctx] {
    ctx.action = [f](Client& client) -> absl::StatusOr<int> {
      const std::string path = "/v1/admin/nodes/" + UrlEncode(f->name);
      auto res = client.Request("POST", path + "/drain", nullptr);
      if (!res.ok()) return res.status();
      if (!f->wait) {
        PrintJson(res->body);
        return 0;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(f->timeout_s);
      int64_t last = -1;
      for (;;) {
        auto list = client.Request("GET", "/v1/admin/nodes", nullptr);
        if (!list.ok()) return list.status();
        int64_t held = -1;
        for (const json& n : list->body.value("nodes", json::array())) {
          if (n.value("name", "") == f->name) held = n.value("sandboxes", int64_t{0});
        }
        if (held < 0) return absl::NotFoundError(fmt::format("node {} is gone", f->name));
        if (held == 0) {
          fmt::print(stderr, "node {} is drained: it holds no sandbox\n", f->name);
          return 0;
        }
        if (held != last) fmt::print(stderr, "node {}: {} sandboxes left\n", f->name, held);
        last = held;
        if (std::chrono::steady_clock::now() >= deadline) {
          return absl::DeadlineExceededError(fmt::format(
              "node {} still holds {} sandboxes after {} s", f->name, held, f->timeout_s));
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    };
  });
  CLI::App* activate = node->add_subcommand("activate", "Place sandboxes on a drained node again");
  activate->add_option("name", f->name, "The node's name")->required();
  activate->callback([f, &ctx] {
    ctx.action = Call("POST", "/v1/admin/nodes/" + UrlEncode(f->name) + "/activate");
  });
}

}  // namespace

void RegisterAdminCommands(CLI::App& app, Context& ctx) {
  CLI::App* admin = app.add_subcommand("admin", "Tenants, tokens, the audit log (docs/tenancy.md) and nodes (docs/scale.md)");
  admin->require_subcommand(1);
  RegisterTenant(*admin, ctx);
  RegisterToken(*admin, ctx);
  RegisterAudit(*admin, ctx);
  RegisterAttachKeys(*admin, ctx);
  RegisterNodes(*admin, ctx);
}

}  // namespace sbx::cli
