// Egress: `sbx egress SANDBOX_ID` (its rules, denials by reason and recent denials; with
// --allow or --allow-nothing it replaces a running sandbox's allow rules first: PATCH), and the
// --allow values of `sbx create`/`sbx run` turned into rules.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli_common.h"

namespace sbx::cli {

// "203.0.113.0/24:443", "2001:db8::/32:443", "203.0.113.7:80", "203.0.113.7" -> a rule. The
// port is what follows the prefix length (after '/'), or the one colon of a bare IPv4 address.
absl::StatusOr<nlohmann::json> ParseAllowFlag(const std::string& spec) {
  std::string cidr = spec, ports;
  const size_t slash = spec.find('/');
  const size_t colon = slash != std::string::npos ? spec.find(':', slash)
                       : spec.find(':') == spec.rfind(':') ? spec.find(':')
                                                           : std::string::npos;
  if (colon != std::string::npos) {
    cidr = spec.substr(0, colon);
    ports = spec.substr(colon + 1);
    if (ports.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("--allow '{}': expected CIDR[:PORT] or CIDR[:LO-HI]", spec));
    }
  }
  if (cidr.empty()) {
    return absl::InvalidArgumentError(fmt::format("--allow '{}': expected CIDR[:PORT]", spec));
  }
  nlohmann::json rule = {{"cidr", cidr}};
  if (!ports.empty()) rule["ports"] = ports;
  return rule;
}

void RegisterEgressCommand(CLI::App& app, Context& ctx) {
  struct Flags {
    std::string id;
    std::vector<std::string> allow;
    bool allow_nothing = false;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "egress",
      "Print a sandbox's egress profile, rules, denied packets by reason and recent denials as "
      "JSON; with --allow (or --allow-nothing) first replace its allow rules, within its profile");
  cmd->add_option("sandbox", f->id, "Sandbox id (sbx_…)")->required();
  cmd->add_option("--allow", f->allow,
                  "CIDR[:PORT] the running sandbox may reach from now on (repeatable; replaces "
                  "its allow rules; open connections they forbid are cut)");
  cmd->add_flag("--allow-nothing", f->allow_nothing,
                "replace its allow rules with none (cuts every open connection)");
  cmd->callback([f, &ctx] {
    if (absl::Status s = CheckId(f->id, "sbx"); !s.ok()) {
      ctx.usage_errors.push_back({fmt::format("egress: {}", Msg(s))});
      return;
    }
    if (f->allow_nothing && !f->allow.empty()) {
      ctx.usage_errors.push_back({"egress: --allow and --allow-nothing exclude each other"});
      return;
    }
    std::optional<nlohmann::json> patch;
    if (f->allow_nothing || !f->allow.empty()) {
      nlohmann::json rules = nlohmann::json::array();
      for (const auto& spec : f->allow) {
        auto rule = ParseAllowFlag(spec);
        if (!rule.ok()) {
          ctx.usage_errors.push_back({fmt::format("egress: {}", Msg(rule.status()))});
          return;
        }
        rules.push_back(std::move(*rule));
      }
      patch = nlohmann::json{{"allow", std::move(rules)}};
    }
    ctx.action = [f, patch](Client& client) -> absl::StatusOr<int> {
      const std::string target = fmt::format("/v1/sandboxes/{}/egress", f->id);
      if (patch) {
        // A PATCH is idempotent: the client's one retry on a stale connection is harmless.
        auto res = client.Request("PATCH", target, &*patch);
        if (!res.ok()) {
          return absl::Status(res.status().code(), fmt::format("egress {}: {}", f->id, Msg(res.status())));
        }
        PrintJson(res->body);
        return 0;
      }
      auto res = client.Get(target);
      if (!res.ok()) {
        return absl::Status(res.status().code(), fmt::format("egress {}: {}", f->id, Msg(res.status())));
      }
      PrintJson(*res);
      return 0;
    };
  });
}

}  // namespace sbx::cli
