// The pieces of registry auth and error bodies that do not touch the network, apart so the
// unit tests reach them: WWW-Authenticate challenges, basic credentials, token answers and the
// registry's JSON error body.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace sbx::registry {

// `Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull"`.
struct Challenge {
  std::string scheme;                         // lowercase: "basic", "bearer", …
  std::map<std::string, std::string> params;  // keys lowercase, values unquoted
};
Challenge ParseChallenge(std::string_view header);

// "Authorization: Basic <base64(user:password)>".
std::string BasicAuthorization(const std::string& username, const std::string& password);

// The token of a token service's answer ({"token": …} or {"access_token": …}); an error
// when there is none or it could not be a header value.
absl::StatusOr<std::string> TokenFromAnswer(std::string_view body);

// ": CODE message" of a registry's {"errors":[{"code":…,"message":…}]} body, or "".
std::string RegistryErrorDetail(std::string_view body);

}  // namespace sbx::registry
