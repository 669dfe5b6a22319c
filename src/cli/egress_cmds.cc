// Egress: `sbx egress SANDBOX_ID` (its rules and denials by reason), and the --allow values of
// `sbx create`/`sbx run` turned into rules.
#include <memory>

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
  auto id = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "egress", "Print a sandbox's egress profile, rules and denied packets by reason as JSON");
  cmd->add_option("sandbox", *id, "Sandbox id (sbx_…)")->required();
  cmd->callback([id, &ctx] {
    if (absl::Status s = CheckId(*id, "sbx"); !s.ok()) {
      ctx.usage_errors.push_back({fmt::format("egress: {}", Msg(s))});
      return;
    }
    ctx.action = [id](Client& client) -> absl::StatusOr<int> {
      auto res = client.Get(fmt::format("/v1/sandboxes/{}/egress", *id));
      if (!res.ok()) {
        return absl::Status(res.status().code(), fmt::format("egress {}: {}", *id, Msg(res.status())));
      }
      PrintJson(*res);
      return 0;
    };
  });
}

}  // namespace sbx::cli
