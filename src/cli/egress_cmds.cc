// Egress: `sbx egress SANDBOX_ID` (its rules, denials by reason and recent denials; with
// --allow or --allow-nothing it replaces a running sandbox's allow rules first: PATCH), and the
// --allow values of `sbx create`/`sbx run` turned into rules.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/cli_common.h"

namespace sbx::cli {

namespace {

constexpr const char* kAllowForms =
    "expected CIDR[:PORT], [IPV6]:PORT, or a host name or pattern such as pypi.org or "
    "*.pythonhosted.org, with an optional :PORT or :LO-HI";

// The shape of a host name or "*." and one (the server checks it again and names the field):
// letters, digits, '-' and '.', no empty label, no '*' but a leading "*.".
bool LooksLikeDomain(std::string_view s) {
  if (s.starts_with("*.")) s.remove_prefix(2);
  if (s.empty() || s.front() == '.' || s.back() == '.' || s.find("..") != std::string_view::npos) {
    return false;
  }
  bool letter = false;
  for (char c : s) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    letter = letter || alpha;
    if (!alpha && !(c >= '0' && c <= '9') && c != '-' && c != '.') return false;
  }
  // All digits and dots is a (possibly malformed) IPv4 address, which belongs in "cidr".
  return letter;
}

// PORT or LO-HI, digits only (the server checks the range and names the field).
bool LooksLikePorts(std::string_view s) {
  const size_t dash = s.find('-');
  auto digits = [](std::string_view d) {
    return !d.empty() && d.size() <= 5 && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (dash == std::string_view::npos) return digits(s);
  return digits(s.substr(0, dash)) && digits(s.substr(dash + 1));
}

// An IPv4 or IPv6 address and an optional prefix length ("http://pypi.org" is not one).
bool LooksLikeCidr(std::string_view s) {
  const size_t slash = s.find('/');
  const std::string_view addr = s.substr(0, slash);
  if (addr.empty() || addr.find_first_not_of("0123456789abcdefABCDEF:.") != std::string_view::npos) {
    return false;
  }
  if (slash == std::string_view::npos) return true;
  const std::string_view len = s.substr(slash + 1);
  return !len.empty() && len.size() <= 3 && len.find_first_not_of("0123456789") == std::string_view::npos;
}

}  // namespace

// "203.0.113.0/24:443", "2001:db8::/32:443", "[2001:db8::1]:443", "203.0.113.7:80",
// "203.0.113.7", "pypi.org", "*.pythonhosted.org:443" -> a rule. A CIDR's port is what follows
// the prefix length (after '/'), or the one colon of a bare IPv4 address or a name; a bare
// IPv6 address has no port unless bracketed. A name becomes {"domain": ...}, the rest
// {"cidr": ...}: sbxd tells them apart the same way and names the field it refuses.
absl::StatusOr<nlohmann::json> ParseAllowFlag(const std::string& spec) {
  std::string dest = spec, ports;
  size_t colon = std::string::npos;
  if (spec.starts_with("[")) {
    const size_t close = spec.find(']');
    if (close == std::string::npos || close == 1 ||
        (close + 1 < spec.size() && spec[close + 1] != ':')) {
      return absl::InvalidArgumentError(fmt::format("--allow '{}': {}", spec, kAllowForms));
    }
    dest = spec.substr(1, close - 1);
    if (close + 1 < spec.size()) colon = close + 1;
  } else {
    const size_t slash = spec.find('/');
    colon = slash != std::string::npos ? spec.find(':', slash)
            : spec.find(':') == spec.rfind(':') ? spec.find(':')
                                                : std::string::npos;
    if (colon != std::string::npos) dest = spec.substr(0, colon);
  }
  if (colon != std::string::npos) {
    ports = spec.substr(colon + 1);
    if (!LooksLikePorts(ports)) {
      return absl::InvalidArgumentError(fmt::format("--allow '{}': {}", spec, kAllowForms));
    }
  }
  if (dest.empty()) {
    return absl::InvalidArgumentError(fmt::format("--allow '{}': {}", spec, kAllowForms));
  }
  const bool name = dest.find('/') == std::string::npos && dest.find(':') == std::string::npos &&
                    !spec.starts_with("[");
  if (name && dest.find_first_not_of("0123456789.") != std::string::npos && !LooksLikeDomain(dest)) {
    return absl::InvalidArgumentError(fmt::format("--allow '{}': {}", spec, kAllowForms));
  }
  if (!name && !LooksLikeCidr(dest)) {
    return absl::InvalidArgumentError(fmt::format("--allow '{}': {}", spec, kAllowForms));
  }
  nlohmann::json rule = {{name && LooksLikeDomain(dest) ? "domain" : "cidr", dest}};
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
                  "CIDR[:PORT] or HOST[:PORT] (pypi.org, *.pythonhosted.org:443; PORT may be "
                  "LO-HI) the running sandbox may reach from now on (repeatable; replaces its "
                  "allow rules; open connections they forbid are cut)");
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
