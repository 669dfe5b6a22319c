#include "daemon/templates_config.h"

#include <fmt/format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/json_util.h"
#include "common/status_util.h"

namespace sbx::daemon {

absl::StatusOr<std::map<std::string, registry::RegistrySettings>> ParseRegistryAuth(
    const std::string& text, const std::string& where) {
  std::map<std::string, registry::RegistrySettings> out;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", where, why));
  };
  auto doc = ParseUntrustedJson(text);
  if (!doc.ok()) return bad("not JSON: " + std::string(doc.status().message()));
  auto auths = doc->find("auths");
  if (!doc->is_object() || auths == doc->end() || !auths->is_object()) {
    return bad("expected {\"auths\": {\"HOST[:PORT]\": {...}}}");
  }
  for (const auto& [host, entry] : auths->items()) {
    if (!entry.is_object()) return bad(fmt::format("auths.{} is not an object", host));
    registry::RegistrySettings s;
    auto str = [&](const char* k) {
      auto it = entry.find(k);
      return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (std::string b64 = str("auth"); !b64.empty()) {
      std::string plain;
      if (!absl::Base64Unescape(b64, &plain) || plain.find(':') == std::string::npos) {
        return bad(fmt::format("auths.{}.auth is not base64 of \"user:password\"", host));
      }
      s.username = plain.substr(0, plain.find(':'));
      s.password = plain.substr(plain.find(':') + 1);
    } else {
      s.username = str("username");
      s.password = str("password");
      if (s.username.empty()) {
        return bad(fmt::format("auths.{} has neither \"auth\" nor \"username\"", host));
      }
    }
    // Docker's file names hosts with a scheme at times ("https://index.docker.io/v1/").
    std::string key = host;
    for (const char* scheme : {"https://", "http://"}) {
      if (key.rfind(scheme, 0) == 0) key = key.substr(std::string(scheme).size());
    }
    key = key.substr(0, key.find('/'));
    if (key == "index.docker.io" || key == "docker.io") key = "registry-1.docker.io";
    out[key] = s;
  }
  return out;
}

absl::StatusOr<std::map<std::string, registry::RegistrySettings>> RegistryCredentials(
    const Config& cfg) {
  const auto& t = cfg.templates;
  std::map<std::string, registry::RegistrySettings> out;
  if (!t.registry_auth_file.empty()) {
    auto text = ReadFileToString(t.registry_auth_file);
    if (!text.ok()) return Annotate(text.status(), Describe(cfg, "templates.registry_auth_file"));
    SBX_ASSIGN_OR_RETURN(out,
                         ParseRegistryAuth(*text, Describe(cfg, "templates.registry_auth_file")));
  }
  for (absl::string_view host : absl::StrSplit(t.registry_insecure, ',', absl::SkipWhitespace())) {
    out[std::string(absl::StripAsciiWhitespace(host))].insecure = true;
  }
  if (!t.registry_ca_file.empty()) {
    // One bundle for every registry, listed or not: the "" entry is the client's default.
    out[""].ca_file = t.registry_ca_file;
    for (auto& [host, s] : out) s.ca_file = t.registry_ca_file;
  }
  return out;
}

}  // namespace sbx::daemon
