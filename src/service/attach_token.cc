#include "service/attach_token.h"

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/digest.h"
#include "common/json_util.h"
#include "common/status_util.h"
#include "common/time_util.h"

namespace sbx::service {
namespace {
constexpr char kPrefix[] = "sat1.";

absl::Status Bad(const char* why) {
  return ApiError(absl::StatusCode::kUnauthenticated, "unauthenticated",
                  std::string("attach token is ") + why);
}
}  // namespace

AttachTokens::Minted AttachTokens::Mint(const std::string& session_id,
                                        const std::string& tenant_id) const {
  return MintAt(session_id, tenant_id, std::chrono::system_clock::now());
}

AttachTokens::Minted AttachTokens::MintAt(const std::string& session_id,
                                          const std::string& tenant_id,
                                          std::chrono::system_clock::time_point now) const {
  auto exp = now + ttl();
  int64_t exp_unix =
      std::chrono::duration_cast<std::chrono::seconds>(exp.time_since_epoch()).count();
  nlohmann::json claims = {{"sid", session_id}, {"ten", tenant_id}, {"exp", exp_unix}};
  std::string body = std::string(kPrefix) + Base64UrlEncode(claims.dump());
  std::string token = body + "." + Base64UrlEncode(HmacSha256(key_, body));
  return {token, FormatRfc3339(std::chrono::system_clock::time_point(std::chrono::seconds(exp_unix)))};
}

absl::StatusOr<AttachTokens::Claims> AttachTokens::Verify(const std::string& token) const {
  return VerifyAt(token, std::chrono::system_clock::now());
}

absl::StatusOr<AttachTokens::Claims> AttachTokens::VerifyAt(
    const std::string& token, std::chrono::system_clock::time_point now) const {
  if (token.size() > 1024 || token.rfind(kPrefix, 0) != 0) return Bad("malformed");
  auto dot = token.rfind('.');
  if (dot == std::string::npos || dot < sizeof(kPrefix) - 1) return Bad("malformed");
  std::string body = token.substr(0, dot);
  auto sig = Base64UrlDecode(token.substr(dot + 1));
  if (!sig || !ConstantTimeEquals(*sig, HmacSha256(key_, body))) return Bad("invalid");
  auto raw = Base64UrlDecode(body.substr(sizeof(kPrefix) - 1));
  if (!raw) return Bad("malformed");
  // Only text sbxd signed gets here; parsed like any other all the same.
  auto parsed = ParseUntrustedJson(*raw);
  if (!parsed.ok()) return Bad("malformed");
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("sid") || !j["sid"].is_string() ||
      !j.contains("ten") || !j["ten"].is_string() || !j.contains("exp") ||
      !j["exp"].is_number_integer()) {
    return Bad("malformed");
  }
  Claims c{j["sid"].get<std::string>(), j["ten"].get<std::string>(), j["exp"].get<int64_t>()};
  int64_t now_unix =
      std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  if (now_unix >= c.expires_unix) return Bad("expired");
  return c;
}

}  // namespace sbx::service
