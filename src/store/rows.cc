#include "store/rows.h"

#include "common/base64.h"
#include "common/json_util.h"

namespace sbx::store {

std::string EncodePageToken(const SandboxRecord& last) {
  return Base64UrlEncode(Json::array({last.created_at, last.id}).dump());
}

std::optional<std::pair<std::string, std::string>> DecodePageToken(const std::string& token) {
  std::optional<std::string> raw = Base64UrlDecode(token);
  if (!raw) return std::nullopt;
  // The token comes back from the client (?page_token=): any bytes at all.
  auto parsed = ParseUntrustedJson(*raw);
  if (!parsed.ok()) return std::nullopt;
  const Json& j = *parsed;
  if (!j.is_array() || j.size() != 2 || !j[0].is_string() || !j[1].is_string()) {
    return std::nullopt;
  }
  return std::make_pair(j[0].get<std::string>(), j[1].get<std::string>());
}

}  // namespace sbx::store
