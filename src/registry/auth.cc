// Registry auth helpers (auth.h).
#include "registry/auth.h"

#include <cctype>

#include <fmt/format.h>

#include "common/base64.h"
#include "common/json_util.h"

namespace sbx::registry {
namespace {

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Challenge ParseChallenge(std::string_view s) {
  Challenge out;
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t sp = s.find(' ', i);
  out.scheme = Lower(std::string(s.substr(i, sp == std::string_view::npos ? s.npos : sp - i)));
  if (sp == std::string_view::npos) return out;
  i = sp + 1;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == ',')) ++i;
    const size_t eq = s.find('=', i);
    if (eq == std::string_view::npos) break;
    std::string key = Lower(std::string(s.substr(i, eq - i)));
    while (!key.empty() && key.back() == ' ') key.pop_back();
    i = eq + 1;
    std::string value;
    if (i < s.size() && s[i] == '"') {
      ++i;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        value.push_back(s[i++]);
      }
      ++i;  // the closing quote
    } else {
      while (i < s.size() && s[i] != ',') value.push_back(s[i++]);
      while (!value.empty() && value.back() == ' ') value.pop_back();
    }
    out.params[key] = value;
  }
  return out;
}

std::string BasicAuthorization(const std::string& username, const std::string& password) {
  return "Authorization: Basic " + Base64Encode(username + ":" + password);
}

absl::StatusOr<std::string> TokenFromAnswer(std::string_view body) {
  auto j = ParseUntrustedJson(body);
  std::string token;
  if (j.ok() && j->is_object()) {
    for (const char* key : {"token", "access_token"}) {
      auto it = j->find(key);
      if (it != j->end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
        token = it->get<std::string>();
        break;
      }
    }
  }
  if (token.empty()) return absl::UnauthenticatedError("the token service answered no token");
  // It goes into a header line: nothing that could end the line or start another.
  if (token.size() > 16384) return absl::UnauthenticatedError("the token is over 16 KiB");
  for (unsigned char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::UnauthenticatedError("the token has characters a header cannot carry");
    }
  }
  return token;
}

std::string RegistryErrorDetail(std::string_view body) {
  auto j = ParseUntrustedJson(body);
  if (!j.ok() || !j->is_object()) return "";
  auto errors = j->find("errors");
  if (errors == j->end() || !errors->is_array() || errors->empty() ||
      !(*errors)[0].is_object()) {
    return "";
  }
  const nlohmann::json& e = (*errors)[0];
  auto str = [&](const char* key) {
    auto it = e.find(key);
    return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  // Bounded in bytes: it goes into every error message of the pull.
  return ": " + str("code").substr(0, 60) + " " + str("message").substr(0, 240);
}

}  // namespace sbx::registry
