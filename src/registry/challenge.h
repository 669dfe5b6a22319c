// The parameters of a registry's WWW-Authenticate challenge (`realm="…",service="…"`, after
// the scheme), which a registry, possibly hostile, sends: parsed in one linear pass, keys
// lowercased, quoted values unescaped; a malformed rest is dropped (fuzz:
// tests/fuzz/registry_reference_fuzz.cc).
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace sbx::registry {

std::map<std::string, std::string> ParseChallengeParams(std::string_view s);

}  // namespace sbx::registry
