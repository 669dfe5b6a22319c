// `sbx port SANDBOX_ID PORT`: where a server listening in the sandbox is reached through sbxd
// (docs/api.md, "Ports"): the path form, and the host-name form when sbxd has ports.domain.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "cli/cli_common.h"

namespace sbx::cli {

void RegisterPortCommand(CLI::App& app, Context& ctx) {
  auto id = std::make_shared<std::string>();
  auto port = std::make_shared<int>(0);
  auto json_out = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "port", "Print the URL of a port of a sandbox (path form; host-name form when sbxd has "
              "ports.domain). Requests need the sandbox's traffic token (--json shows it) in "
              "X-Sbx-Traffic-Token, or a management token, unless it has public_ports");
  cmd->add_option("sandbox", *id, "Sandbox id (sbx_…)")->required();
  cmd->add_option("port", *port, "TCP port the server listens on in the sandbox")->required();
  cmd->add_flag("--json", *json_out, "Print {url, host_url, traffic_token, public_ports}");
  cmd->callback([id, port, json_out, &ctx] {
    if (absl::Status s = CheckId(*id, "sbx"); !s.ok()) {
      ctx.usage_errors.push_back({fmt::format("port: {}", Msg(s))});
      return;
    }
    if (*port < 1 || *port > 65535) {
      ctx.usage_errors.push_back({fmt::format("port: {} is not a port (1 to 65535)", *port)});
      return;
    }
    ctx.action = [id, port, json_out](Client& client) -> absl::StatusOr<int> {
      auto sb = client.Get(fmt::format("/v1/sandboxes/{}", *id));
      if (!sb.ok()) {
        return absl::Status(sb.status().code(), fmt::format("port {}: {}", *id, Msg(sb.status())));
      }
      const Endpoint& ep = client.endpoint();
      const std::string url = fmt::format("{}/v1/sandboxes/{}/ports/{}/", ep.url, *id, *port);
      std::string host_url;
      if (sb->contains("ports_domain") && (*sb)["ports_domain"].is_string()) {
        // The id's `_` as `-`: a host name has no `_`, and a wildcard certificate matches no
        // label holding one (sbxd takes both forms).
        std::string label = *id;
        std::replace(label.begin(), label.end(), '_', '-');
        host_url = fmt::format("{}://{}-{}.{}:{}{}/", ep.scheme, *port, label,
                               (*sb)["ports_domain"].get<std::string>(), ep.port, ep.base_path);
      }
      if (*json_out) {
        PrintJson({{"url", url},
                   {"host_url", host_url.empty() ? nlohmann::json(nullptr) : nlohmann::json(host_url)},
                   {"traffic_token", sb->value("traffic_token", nlohmann::json(nullptr))},
                   {"public_ports", sb->value("public_ports", false)}});
        return 0;
      }
      std::string out = url + "\n";
      if (!host_url.empty()) out += host_url + "\n";
      SBX_RETURN_IF_ERROR(WriteAll(1, out));
      return 0;
    };
  });
}

}  // namespace sbx::cli
