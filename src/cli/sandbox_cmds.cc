// Sandbox lifecycle commands: run, create, ls, inspect, rm, pause, suspend, wake, op, version.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "cli/cli_common.h"

namespace sbx::cli {
namespace {

// Flags that describe a new sandbox (shared by run and create).
struct SandboxFlags {
  std::string tpl;
  std::string runtime;
  int64_t vcpu = 0;
  int64_t memory_mib = 0;
  int64_t disk_mib = 0;
  std::vector<std::string> labels;
  std::string egress;              // egress_profile
  std::vector<std::string> allow;  // narrowing rules, CIDR[:PORT] or HOST[:PORT]
  std::vector<std::string> env;  // sandbox env (create); run puts -e into the session instead
  int wait_timeout_s = 300;
  CLI::Option* vcpu_opt = nullptr;
  CLI::Option* memory_opt = nullptr;
  CLI::Option* disk_opt = nullptr;
};

void AddSandboxFlags(CLI::App* cmd, SandboxFlags& f, bool with_env) {
  cmd->add_option("--template", f.tpl, "Template name[:tag] (server default: base)");
  f.vcpu_opt = cmd->add_option("--vcpu", f.vcpu, "Virtual CPUs");
  f.memory_opt = cmd->add_option("--memory", f.memory_mib, "Memory limit in MiB");
  f.disk_opt = cmd->add_option("--disk", f.disk_mib, "Disk size in MiB");
  cmd->add_option("--runtime", f.runtime, "Runtime backend (ns, fake; server default)");
  cmd->add_option("--egress", f.egress,
                  "Egress profile (none, open or a deployment's allow-list; server default: none)");
  cmd->add_option("--allow", f.allow,
                  "Narrow the profile to CIDR[:PORT] or HOST[:PORT] (pypi.org, "
                  "*.pythonhosted.org:443; PORT may be LO-HI; repeatable; each within the "
                  "profile)")
      ->allow_extra_args(false);
  cmd->add_option("--label", f.labels, "Label key=value (repeatable)")
      ->allow_extra_args(false);
  if (with_env) {
    cmd->add_option("-e,--env", f.env, "Default environment KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  }
  cmd->add_option("--wait-timeout", f.wait_timeout_s,
                  "Seconds to wait for an operation to complete")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

absl::StatusOr<nlohmann::json> BuildCreateBody(const SandboxFlags& f) {
  nlohmann::json body = nlohmann::json::object();
  if (!f.tpl.empty()) body["template"] = f.tpl;
  if (!f.runtime.empty()) body["runtime"] = f.runtime;
  if (!f.egress.empty()) body["egress_profile"] = f.egress;
  if (!f.allow.empty()) {
    nlohmann::json rules = nlohmann::json::array();
    for (const auto& a : f.allow) {
      auto rule = ParseAllowFlag(a);
      if (!rule.ok()) return rule.status();
      rules.push_back(*rule);
    }
    body["egress"] = {{"allow", std::move(rules)}};
  }
  nlohmann::json resources = nlohmann::json::object();
  if (f.vcpu_opt->count() > 0) resources["vcpu"] = f.vcpu;
  if (f.memory_opt->count() > 0) resources["memory_mib"] = f.memory_mib;
  if (f.disk_opt->count() > 0) resources["disk_mib"] = f.disk_mib;
  if (!resources.empty()) body["resources"] = resources;
  auto labels = ParseKeyValues(f.labels, "--label");
  if (!labels.ok()) return labels.status();
  if (!labels->empty()) body["labels"] = *labels;
  auto env = ParseKeyValues(f.env, "--env");
  if (!env.ok()) return env.status();
  if (!env->empty()) body["env"] = *env;
  return body;
}

absl::Status Prefix(const absl::Status& s, std::string_view what) {
  return absl::Status(s.code(), fmt::format("{}: {}", what, Msg(s)));
}

struct Created {
  std::string sandbox_id;
  nlohmann::json operation;
};

absl::StatusOr<Created> ParseCreated(const HttpResult& res) {
  Created c;
  if (res.body.is_object() && res.body.contains("sandbox")) {
    c.sandbox_id = JsonString(res.body["sandbox"], "id");
  }
  if (absl::Status s = CheckId(c.sandbox_id, "sbx"); !s.ok()) {
    return absl::InternalError(fmt::format("create sandbox: sbxd returned {}", Msg(s)));
  }
  if (!res.body.contains("operation") || !res.body["operation"].is_object()) {
    return absl::InternalError("create sandbox: sbxd returned no operation");
  }
  c.operation = res.body["operation"];
  return c;
}

// DELETE and wait; returns the finished delete operation.
absl::StatusOr<nlohmann::json> DeleteSandbox(Client& client, const std::string& id, bool wait,
                                             std::chrono::seconds timeout) {
  auto res = client.Request("DELETE", "/v1/sandboxes/" + id, nullptr, NewIdempotencyKey());
  if (!res.ok()) return res.status();
  if (!res->body.is_object() || !res->body.contains("operation") ||
      !res->body["operation"].is_object()) {
    return absl::InternalError("sbxd returned no delete operation");
  }
  if (!wait) return res->body["operation"];
  return WaitOperation(client, res->body["operation"], timeout);
}

void RegisterRun(CLI::App& app, Context& ctx) {
  struct Opts {
    SandboxFlags sandbox;
    std::vector<std::string> argv;
    std::vector<std::string> env;
    std::string cwd;
    std::string user;
    bool keep = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Create a sandbox, run one command in it, delete it; exit with the command's code");
  AddSandboxFlags(cmd, o->sandbox, /*with_env=*/false);
  cmd->add_option("-e,--env", o->env, "Environment variable KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--cwd", o->cwd, "Working directory (absolute path in the sandbox)");
  cmd->add_option("--user", o->user, "User to run as");
  cmd->add_flag("--keep", o->keep, "Keep the sandbox after the command exits");
  cmd->add_option("command", o->argv, "Command and arguments (after --)");
  cmd->callback([o, &ctx] {
    if (o->argv.empty()) {
      ctx.usage_errors.push_back({"run: missing command (sbx run [FLAGS] -- CMD ARGS...)"});
      return;
    }
    auto body = BuildCreateBody(o->sandbox);
    auto env = ParseKeyValues(o->env, "--env");
    if (!body.ok() || !env.ok()) {
      ctx.usage_errors.push_back(
          {std::string((body.ok() ? env.status() : body.status()).message())});
      return;
    }
    nlohmann::json session = {{"argv", o->argv}};
    if (!env->empty()) session["env"] = *env;
    if (!o->cwd.empty()) session["cwd"] = o->cwd;
    if (!o->user.empty()) session["user"] = o->user;
    ctx.action = [o, create_body = *body, session](Client& client) -> absl::StatusOr<int> {
      std::chrono::seconds timeout(o->sandbox.wait_timeout_s);
      std::string create_key = NewIdempotencyKey();
      auto res = client.Request("POST", "/v1/sandboxes", &create_body, create_key);
      if (!res.ok() && absl::IsCancelled(res.status())) {
        // The create may have reached sbxd before the signal. Replaying it with the same key
        // returns that sandbox (or makes one) so that it can be deleted rather than leaked.
        PrintError("interrupted; making sure no sandbox is left behind");
        res = client.Request("POST", "/v1/sandboxes", &create_body, create_key);
        if (!res.ok()) {
          PrintError(fmt::format("could not check for a sandbox left behind: {}",
                                 Msg(res.status())));
          return 128 + client.interrupt_signal();
        }
      }
      if (!res.ok()) return Prefix(res.status(), "create sandbox");
      auto created = ParseCreated(*res);
      if (!created.ok()) return created.status();
      const std::string id = created->sandbox_id;
      client.set_second_signal_note(
          fmt::format("sandbox {} may be left behind; remove it with: sbx rm {}", id, id));

      // Deletes the sandbox (unless --keep) and returns the exit code to use.
      auto finish = [&](int code) -> int {
        if (o->keep) {
          PrintError(fmt::format("kept sandbox {}", id));
          return code;
        }
        auto del = DeleteSandbox(client, id, /*wait=*/true, timeout);
        if (!del.ok()) {
          PrintError(fmt::format("delete sandbox {}: {}; remove it with: sbx rm {}", id,
                                 Msg(del.status()), id));
          if (absl::IsCancelled(del.status())) return 128 + client.interrupt_signal();
          return code != 0 ? code : kExitFailure;
        }
        return code;
      };
      auto interrupted = [&]() -> int {
        PrintError(o->keep ? std::string("interrupted")
                           : fmt::format("interrupted; deleting sandbox {}", id));
        return finish(128 + client.interrupt_signal());
      };
      if (client.interrupted()) return interrupted();

      auto op = WaitOperation(client, created->operation, timeout);
      if (!op.ok()) {
        if (absl::IsCancelled(op.status())) return interrupted();
        PrintError(fmt::format("create sandbox {}: {}", id, Msg(op.status())));
        return finish(kExitFailure);
      }
      // One request creates the session and streams it (`?attach=true`).
      AttachTarget t;
      t.create_path = fmt::format("/v1/sandboxes/{}/sessions", id);
      t.create_body = session.dump();
      t.idempotency_key = NewIdempotencyKey();
      auto code = StreamSession(client, t);
      if (!code.ok()) {
        if (absl::IsCancelled(code.status())) return interrupted();
        if (t.session_id.empty()) {
          PrintError(fmt::format("start command in {}: {}", id, Msg(code.status())));
        } else {
          PrintError(code.status());
        }
        return finish(kExitFailure);
      }
      return finish(*code);
    };
  });
}

void RegisterCreate(CLI::App& app, Context& ctx) {
  struct Opts {
    SandboxFlags sandbox;
    bool no_wait = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("create", "Create a sandbox and print its id");
  AddSandboxFlags(cmd, o->sandbox, /*with_env=*/true);
  cmd->add_flag("--no-wait", o->no_wait, "Print the id without waiting for it to run");
  cmd->callback([o, &ctx] {
    auto body = BuildCreateBody(o->sandbox);
    if (!body.ok()) {
      ctx.usage_errors.push_back({Msg(body.status())});
      return;
    }
    ctx.action = [o, body = *body](Client& client) -> absl::StatusOr<int> {
      auto res = client.Request("POST", "/v1/sandboxes", &body, NewIdempotencyKey());
      if (!res.ok()) {
        if (absl::IsCancelled(res.status())) {
          PrintError("interrupted; the sandbox may or may not have been created: check sbx ls");
          return 128 + client.interrupt_signal();
        }
        return Prefix(res.status(), "create sandbox");
      }
      auto created = ParseCreated(*res);
      if (!created.ok()) return created.status();
      const std::string& id = created->sandbox_id;
      if (!o->no_wait) {
        auto op = WaitOperation(client, created->operation,
                                std::chrono::seconds(o->sandbox.wait_timeout_s));
        if (!op.ok()) {
          if (absl::IsCancelled(op.status())) {
            PrintError(fmt::format("interrupted; sandbox {} was not deleted (still being "
                                   "created): sbx inspect {}",
                                   id, id));
            return 128 + client.interrupt_signal();
          }
          return Prefix(op.status(),
                        fmt::format("create sandbox {} (remove it with: sbx rm {})", id, id));
        }
      }
      SBX_RETURN_IF_ERROR(WriteAll(1, id + "\n"));
      return 0;
    };
  });
}

void RegisterLs(CLI::App& app, Context& ctx) {
  struct Opts {
    std::string state;
    std::vector<std::string> labels;
    bool json = false;
    std::string remote;  // SANDBOX_ID:PATH: list files instead
    int depth = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("ls", "List sandboxes, or with SANDBOX_ID:PATH the files of a "
                                           "sandbox's directory");
  cmd->add_option("target", o->remote, "SANDBOX_ID:PATH: list this directory of the sandbox");
  cmd->add_option("--depth", o->depth, "With SANDBOX_ID:PATH: levels to descend (1-32)")
      ->check(CLI::Range(1, 32));
  cmd->add_option("--state", o->state,
                  "Only sandboxes in this state (creating, running, failed, deleting, deleted)");
  cmd->add_option("--label", o->labels, "Only sandboxes with label key=value (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--json", o->json, "Print a JSON array of sandbox objects");
  cmd->callback([o, &ctx] {
    if (!o->remote.empty()) {
      auto ref = ParseRemotePath(o->remote);
      if (!ref) {
        ctx.usage_errors.push_back(
            {fmt::format("ls: expected SANDBOX_ID:PATH (sbx_…:/dir), got \"{}\"", o->remote)});
        return;
      }
      if (!o->state.empty() || !o->labels.empty()) {
        ctx.usage_errors.push_back({"ls: --state and --label filter sandboxes, not files"});
        return;
      }
      ctx.action = [o, ref = *ref](Client& client) {
        return ListFiles(client, ref.first, ref.second, o->depth, o->json);
      };
      return;
    }
    auto labels = ParseKeyValues(o->labels, "--label");
    if (!labels.ok()) {
      ctx.usage_errors.push_back({Msg(labels.status())});
      return;
    }
    ctx.action = [o](Client& client) -> absl::StatusOr<int> {
      std::string query = "?limit=500";
      if (!o->state.empty()) query += "&state=" + UrlEncode(o->state);
      for (const std::string& l : o->labels) query += "&label=" + UrlEncode(l);
      nlohmann::json all = nlohmann::json::array();
      std::string page_token;
      for (int page = 0;; ++page) {
        std::string target = "/v1/sandboxes" + query;
        if (!page_token.empty()) target += "&page_token=" + UrlEncode(page_token);
        auto res = client.Get(target);
        if (!res.ok()) return Prefix(res.status(), "list sandboxes");
        if (!res->is_object() || !res->contains("sandboxes") ||
            !(*res)["sandboxes"].is_array()) {
          return absl::InternalError("list sandboxes: sbxd returned no sandboxes array");
        }
        for (auto& s : (*res)["sandboxes"]) all.push_back(std::move(s));
        std::string next = JsonString(*res, "next_page_token");
        if (next.empty()) break;
        if (next == page_token || page > 100000) {
          return absl::InternalError("list sandboxes: sbxd repeated a page token");
        }
        page_token = next;
      }
      if (o->json) {
        PrintJson(all);
        return 0;
      }
      std::vector<std::array<std::string, 4>> rows;
      rows.push_back({"ID", "STATE", "TEMPLATE", "CREATED"});
      for (const auto& s : all) {
        rows.push_back({JsonString(s, "id"), JsonString(s, "state"), JsonString(s, "template"),
                        JsonString(s, "created_at")});
      }
      std::array<size_t, 4> width{};
      for (const auto& r : rows) {
        for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
      }
      std::string out;
      for (const auto& r : rows) {
        out += fmt::format("{:<{}}   {:<{}}   {:<{}}   {}\n", r[0], width[0], r[1], width[1],
                           r[2], width[2], r[3]);
      }
      SBX_RETURN_IF_ERROR(WriteAll(1, out));
      return 0;
    };
  });
}

void RegisterInspect(CLI::App& app, Context& ctx) {
  auto id = std::make_shared<std::string>();
  CLI::App* cmd =
      app.add_subcommand("inspect", "Print a sandbox (sbx_…), operation (op_…) or session "
                                    "(ses_…) as JSON");
  cmd->add_option("id", *id, "Object id")->required();
  cmd->callback([id, &ctx] {
    std::string path;
    for (auto [prefix, base] : {std::pair{"sbx", "/v1/sandboxes/"},
                                std::pair{"op", "/v1/operations/"},
                                std::pair{"ses", "/v1/sessions/"}}) {
      if (CheckId(*id, prefix).ok()) path = base + *id;
    }
    if (path.empty()) {
      ctx.usage_errors.push_back(
          {fmt::format("inspect: \"{}\" is not a sandbox, operation or session id", *id)});
      return;
    }
    ctx.action = [id, path](Client& client) -> absl::StatusOr<int> {
      auto res = client.Get(path);
      if (!res.ok()) return Prefix(res.status(), fmt::format("inspect {}", *id));
      PrintJson(*res);
      return 0;
    };
  });
}

void RegisterOp(CLI::App& app, Context& ctx) {
  auto id = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("op", "Print an operation as JSON");
  cmd->add_option("operation", *id, "Operation id (op_…)")->required();
  cmd->callback([id, &ctx] {
    if (absl::Status s = CheckId(*id, "op"); !s.ok()) {
      ctx.usage_errors.push_back({fmt::format("op: {}", Msg(s))});
      return;
    }
    ctx.action = [id](Client& client) -> absl::StatusOr<int> {
      auto res = client.Get("/v1/operations/" + *id);
      if (!res.ok()) return Prefix(res.status(), fmt::format("op {}", *id));
      PrintJson(*res);
      return 0;
    };
  });
}

void RegisterRm(CLI::App& app, Context& ctx) {
  struct Opts {
    std::vector<std::string> ids;
    bool no_wait = false;
    int wait_timeout_s = 300;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("rm", "Delete sandboxes (waits for each deletion)");
  cmd->add_option("sandboxes", o->ids, "Sandbox ids (sbx_…)")->required();
  cmd->add_flag("--no-wait", o->no_wait, "Do not wait for the delete operations");
  cmd->add_option("--wait-timeout", o->wait_timeout_s, "Seconds to wait for each deletion")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([o, &ctx] {
    for (const std::string& id : o->ids) {
      if (absl::Status s = CheckId(id, "sbx"); !s.ok()) {
        ctx.usage_errors.push_back({fmt::format("rm: {}", Msg(s))});
        return;
      }
    }
    ctx.action = [o](Client& client) -> absl::StatusOr<int> {
      int rc = 0;
      // Start every deletion first, so that they proceed in parallel, then wait.
      std::vector<std::pair<std::string, nlohmann::json>> pending;
      for (const std::string& id : o->ids) {
        auto op = DeleteSandbox(client, id, /*wait=*/false, {});
        if (!op.ok()) {
          if (absl::IsCancelled(op.status())) {
            PrintError(fmt::format("interrupted; the deletion of {} may or may not have started",
                                   id));
            return 128 + client.interrupt_signal();
          }
          PrintError(fmt::format("rm {}: {}", id, Msg(op.status())));
          rc = kExitFailure;
          continue;
        }
        pending.emplace_back(id, std::move(*op));
      }
      for (auto& [id, op] : pending) {
        if (!o->no_wait) {
          auto done = WaitOperation(client, op, std::chrono::seconds(o->wait_timeout_s));
          if (!done.ok()) {
            if (absl::IsCancelled(done.status())) {
              PrintError(fmt::format("interrupted; {} is still being deleted: sbx op {}", id,
                                     JsonString(op, "id")));
              return 128 + client.interrupt_signal();
            }
            PrintError(fmt::format("rm {}: {}", id, Msg(done.status())));
            rc = kExitFailure;
            continue;
          }
        }
        SBX_RETURN_IF_ERROR(WriteAll(1, id + "\n"));
      }
      return rc;
    };
  });
}

// pause, suspend and wake share one shape: POST /v1/sandboxes/{id}/<kind> for each id, then
// wait for the operations, like rm.
void RegisterLifecycle(CLI::App& app, Context& ctx, const std::string& kind,
                       const std::string& help) {
  struct Opts {
    std::vector<std::string> ids;
    bool no_wait = false;
    int wait_timeout_s = 300;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(kind, help);
  cmd->add_option("sandboxes", o->ids, "Sandbox ids (sbx_…)")->required();
  cmd->add_flag("--no-wait", o->no_wait, fmt::format("Do not wait for the {} operations", kind));
  cmd->add_option("--wait-timeout", o->wait_timeout_s, "Seconds to wait for each operation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([o, &ctx, kind] {
    for (const std::string& id : o->ids) {
      if (absl::Status s = CheckId(id, "sbx"); !s.ok()) {
        ctx.usage_errors.push_back({fmt::format("{}: {}", kind, Msg(s))});
        return;
      }
    }
    ctx.action = [o, kind](Client& client) -> absl::StatusOr<int> {
      int rc = 0;
      std::vector<std::pair<std::string, nlohmann::json>> pending;
      for (const std::string& id : o->ids) {
        auto res = client.Request("POST", fmt::format("/v1/sandboxes/{}/{}", id, kind), nullptr,
                                  NewIdempotencyKey());
        if (!res.ok()) {
          if (absl::IsCancelled(res.status())) {
            PrintError(fmt::format("interrupted; the {} of {} may or may not have started", kind,
                                   id));
            return 128 + client.interrupt_signal();
          }
          PrintError(fmt::format("{} {}: {}", kind, id, Msg(res.status())));
          rc = kExitFailure;
          continue;
        }
        if (!res->body.is_object() || !res->body.contains("operation") ||
            !res->body["operation"].is_object()) {
          PrintError(fmt::format("{} {}: sbxd returned no operation", kind, id));
          rc = kExitFailure;
          continue;
        }
        pending.emplace_back(id, res->body["operation"]);
      }
      for (auto& [id, op] : pending) {
        if (!o->no_wait) {
          auto done = WaitOperation(client, op, std::chrono::seconds(o->wait_timeout_s));
          if (!done.ok()) {
            if (absl::IsCancelled(done.status())) {
              PrintError(fmt::format("interrupted; {} of {} still in progress: sbx op {}", kind,
                                     id, JsonString(op, "id")));
              return 128 + client.interrupt_signal();
            }
            PrintError(fmt::format("{} {}: {}", kind, id, Msg(done.status())));
            rc = kExitFailure;
            continue;
          }
        }
        SBX_RETURN_IF_ERROR(WriteAll(1, id + "\n"));
      }
      return rc;
    };
  });
}

void RegisterVersion(CLI::App& app, Context& ctx) {
  CLI::App* cmd = app.add_subcommand("version", "Print the client version");
  cmd->callback([&ctx] {
    ctx.needs_client = false;
    ctx.action = [](Client&) -> absl::StatusOr<int> {
      SBX_RETURN_IF_ERROR(WriteAll(1, "sbx " SBX_VERSION " (API v1)\n"));
      return 0;
    };
  });
}

}  // namespace

void RegisterSandboxCommands(CLI::App& app, Context& ctx) {
  RegisterRun(app, ctx);
  RegisterCreate(app, ctx);
  RegisterLs(app, ctx);
  RegisterInspect(app, ctx);
  RegisterRm(app, ctx);
  RegisterLifecycle(app, ctx, "pause",
                    "Pause sandboxes: freeze every process, memory stays resident (waits)");
  RegisterLifecycle(app, ctx, "suspend",
                    "Suspend sandboxes: release what the runtime can (ns: same as pause) (waits)");
  RegisterLifecycle(app, ctx, "wake", "Wake paused or suspended sandboxes (waits)");
  RegisterOp(app, ctx);
  RegisterEgressCommand(app, ctx);
  RegisterPortCommand(app, ctx);
  RegisterVersion(app, ctx);
}

}  // namespace sbx::cli
