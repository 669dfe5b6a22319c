// sbx: command-line client for sbxd (see docs/api.md).
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/cli_common.h"
#include "cli/tls.h"
#include "common/files.h"

namespace {

constexpr const char* kDefaultUrl = "http://127.0.0.1:7070";
constexpr const char* kAdminTokenFile = "/var/lib/sbx/admin-token";

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sbx::cli;
  // A closed stdout must surface as a write error (reported, sandbox cleaned up), not kill us.
  std::signal(SIGPIPE, SIG_IGN);

  Context ctx;
  CLI::App app{"sbx: run commands in sbxd sandboxes", "sbx"};
  app.footer(
      "Environment: SBX_URL (default http://127.0.0.1:7070; https://… verifies sbxd's "
      "certificate), SBX_TOKEN (default: the contents of /var/lib/sbx/admin-token when "
      "readable), SBX_CACERT (as --cacert).\n"
      "Example: sbx run -- python3 -c 'print(1+1)'");
  app.require_subcommand(1);
  app.fallthrough();
  app.add_option("--url", ctx.url_flag, "sbxd URL (overrides SBX_URL)");
  app.add_option("--token", ctx.token_flag, "API token (overrides SBX_TOKEN)");
  app.add_option("--cacert", ctx.cacert_flag,
                 "PEM file of the CA(s) that sign sbxd's certificate, for an https:// URL "
                 "(overrides SBX_CACERT; default: the system's CAs)");
  RegisterSandboxCommands(app, ctx);
  RegisterSessionCommands(app, ctx);
  std::string token;  // filled in below, before any command runs
  RegisterFilesCommands(app, ctx, &token);
  RegisterTemplateCommands(app, ctx, &token);
  RegisterDoctorCommand(app, ctx);
  RegisterAdminCommands(app, ctx);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    PrintError(fmt::format("{} (see: sbx --help)", e.what()));
    return kExitUsage;
  }
  if (!ctx.usage_errors.empty()) {
    PrintError(ctx.usage_errors.front().message);
    return kExitUsage;
  }
  if (!ctx.action) {
    PrintError("no command (see: sbx --help)");
    return kExitUsage;
  }

  Endpoint endpoint;
  if (ctx.needs_client) {
    std::string url = !ctx.url_flag.empty() ? ctx.url_flag : Env("SBX_URL");
    if (url.empty()) url = kDefaultUrl;
    auto parsed = ParseUrl(url);
    if (!parsed.ok()) {
      PrintError(parsed.status());
      return kExitUsage;
    }
    endpoint = *parsed;
    const std::string cacert = !ctx.cacert_flag.empty() ? ctx.cacert_flag : Env("SBX_CACERT");
    if (auto st = SetUpTls(endpoint, cacert); !st.ok()) {
      PrintError(st);
      return kExitUsage;
    }
    token = !ctx.token_flag.empty() ? ctx.token_flag : Env("SBX_TOKEN");
    if (token.empty() && ::access(kAdminTokenFile, R_OK) == 0) {
      token = Trim(sbx::ReadFileOrEmpty(kAdminTokenFile));
    }
    if (token.empty()) {
      PrintError(fmt::format("no API token: set SBX_TOKEN or pass --token (or make {} readable)",
                             kAdminTokenFile));
      return kExitUsage;
    }
    if (token.find_first_of("\r\n") != std::string::npos) {
      PrintError("the API token contains a line break");
      return kExitUsage;
    }
  }

  Client client(endpoint, token);
  client.CatchInterrupts();
  absl::StatusOr<int> rc = ctx.action(client);
  if (!rc.ok()) {
    if (absl::IsCancelled(rc.status()) && client.interrupted()) {
      PrintError("interrupted");
      return 128 + client.interrupt_signal();
    }
    PrintError(rc.status());
    return kExitFailure;
  }
  return *rc;
}
